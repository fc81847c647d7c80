variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. toolrail-dev."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,24}$", var.name))
    error_message = "name must be 3-25 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "environment" {
  type        = string
  description = "Environment name, passed to the API as TOOLRAIL_ENVIRONMENT."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the load balancer and the API tasks."
}

variable "vpc_cidr_block" {
  type        = string
  description = "VPC CIDR; API tasks reach the interface VPC endpoints on 443 inside it."
}

variable "public_subnet_ids" {
  type        = list(string)
  description = "Public subnets for the internet-facing load balancer (at least two zones)."

  validation {
    condition     = length(var.public_subnet_ids) >= 2
    error_message = "An ALB needs subnets in at least two zones."
  }
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets for the API tasks."
}

variable "s3_prefix_list_id" {
  type        = string
  description = "Prefix list of the S3 gateway endpoint (ECR image layers)."
}

variable "cluster_arn" {
  type        = string
  description = "ECS cluster for the API service (the executor module's cluster)."
}

variable "cluster_name" {
  type        = string
  description = "Name of that ECS cluster."
}

variable "image" {
  type        = string
  description = "API/worker container image (docker/Dockerfile), pinned by tag or digest."

  validation {
    condition     = !endswith(var.image, ":latest")
    error_message = "Pin the image by version tag or digest, not :latest."
  }
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate for the HTTPS listener."

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:", var.certificate_arn))
    error_message = "certificate_arn must be an ACM certificate ARN."
  }
}

variable "ssl_policy" {
  type        = string
  description = "Pinned TLS policy of the HTTPS listener (TLS 1.3 with 1.2 fallback, forward secrecy)."
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"

  validation {
    condition     = startswith(var.ssl_policy, "ELBSecurityPolicy-TLS13-")
    error_message = "ssl_policy must be one of the ELBSecurityPolicy-TLS13-* policies."
  }
}

variable "allowed_ingress_cidrs" {
  type        = list(string)
  description = "Client CIDRs allowed to reach the load balancer on 443."
  default     = ["0.0.0.0/0"]
}

variable "waf_enabled" {
  type        = bool
  description = "Attach a WAF web ACL (AWS managed common and known-bad-inputs rules plus a per-IP rate limit)."
  default     = true
}

variable "waf_rate_limit" {
  type        = number
  description = "Requests per five minutes from one IP before WAF blocks it."
  default     = 2000

  validation {
    condition     = var.waf_rate_limit >= 100
    error_message = "waf_rate_limit must be at least 100 (the WAF minimum)."
  }
}

variable "waf_log_group_arn" {
  type        = string
  description = "CloudWatch log group (aws-waf-logs-*) for WAF logs."
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the load balancer from deletion (true in prod; false lets dev be destroyed)."
  default     = true
}

variable "cpu" {
  type        = number
  description = "Fargate CPU units per API task."
  default     = 512
}

variable "memory" {
  type        = number
  description = "Fargate memory (MiB) per API task."
  default     = 1024
}

variable "min_capacity" {
  type        = number
  description = "Minimum API tasks (the API never scales to zero; it must answer)."
  default     = 1

  validation {
    condition     = var.min_capacity >= 1
    error_message = "min_capacity must be at least 1."
  }
}

variable "max_capacity" {
  type        = number
  description = "Maximum API tasks."
  default     = 4
}

variable "requests_per_task" {
  type        = number
  description = "Target ALB requests per task per minute for target-tracking scaling."
  default     = 600
}

variable "decider_backend" {
  type        = string
  description = "TOOLRAIL_DECIDER for the API process (the decide workers do the decoding)."
  default     = "triton"
}

variable "redis_client_security_group_id" {
  type        = string
  description = "Security group that may reach Redis (the redis module's client group)."
}

variable "redis_auth_secret_arn" {
  type        = string
  description = "Secrets Manager secret with JSON {auth_token, url}."
}

variable "redis_url_secret_value_from" {
  type        = string
  description = "ECS valueFrom for REDIS_URL (secret ARN plus :url:: JSON key)."
}

variable "redis_kms_key_arn" {
  type        = string
  description = "KMS key of the Redis secret."
}

variable "log_group_name" {
  type        = string
  description = "Log group for the API containers (observability module)."
}

variable "lb_logs_bucket" {
  type        = string
  description = "S3 bucket for ALB access logs (observability module)."
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (the provider's default_tags carry the common ones)."
  default     = {}
}
