variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. toolrail-dev."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "cidr_block" {
  type        = string
  description = "IPv4 CIDR of the VPC; carved into public, private (workers, API, Redis) and GPU subnets."
  default     = "10.40.0.0/16"

  validation {
    condition     = can(cidrnetmask(var.cidr_block)) && tonumber(split("/", var.cidr_block)[1]) <= 18
    error_message = "cidr_block must be a valid IPv4 CIDR of /18 or larger."
  }
}

variable "az_count" {
  type        = number
  description = "Number of availability zones to spread subnets over."
  default     = 2

  validation {
    condition     = var.az_count >= 2 && var.az_count <= 4
    error_message = "az_count must be between 2 and 4 (ALB and ElastiCache need two zones)."
  }
}

variable "availability_zones" {
  type        = list(string)
  description = "Zone names the subnets may use (the zone data source is pinned to them); empty means the region's zones a, b, ... up to az_count."
  default     = []
}

variable "gpu_availability_zones" {
  type        = list(string)
  description = "Zones for the GPU subnets when GPU capacity is scarce in some zones; empty uses the first az_count zones."
  default     = []
}

variable "nat_gateway_mode" {
  type        = string
  description = "Internet egress for tools that call external APIs: none, single (one NAT, cheap) or per_az (one NAT per zone, HA). AWS APIs go through VPC endpoints either way."
  default     = "single"

  validation {
    condition     = contains(["none", "single", "per_az"], var.nat_gateway_mode)
    error_message = "nat_gateway_mode must be none, single or per_az."
  }
}

variable "interface_endpoints" {
  type        = list(string)
  description = "AWS services reached through interface VPC endpoints, so private tasks need no NAT for AWS APIs."
  default = [
    "ecr.api",
    "ecr.dkr",
    "ecs",
    "ecs-agent",
    "ecs-telemetry",
    "logs",
    "monitoring",
    "secretsmanager",
    "kms",
    "sts",
  ]
}

variable "flow_log_kms_key_arn" {
  type        = string
  description = "KMS key that encrypts the VPC flow log group (the observability module's key)."
}

variable "flow_log_retention_days" {
  type        = number
  description = "Retention of VPC flow logs in days."
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.flow_log_retention_days)
    error_message = "flow_log_retention_days must be a retention CloudWatch Logs accepts."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (the provider's default_tags carry the common ones)."
  default     = {}
}
