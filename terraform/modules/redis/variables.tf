variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. toolrail-dev."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "vpc_id" {
  type        = string
  description = "VPC the cache lives in."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets for the cache nodes, in at least two zones."

  validation {
    condition     = length(var.subnet_ids) >= 2
    error_message = "subnet_ids needs at least two subnets (two zones)."
  }
}

variable "engine_version" {
  type        = string
  description = "Redis engine version."
  default     = "7.1"
}

variable "parameter_group_family" {
  type        = string
  description = "Parameter group family matching engine_version."
  default     = "redis7"
}

variable "node_type" {
  type        = string
  description = "Cache node type."
  default     = "cache.t4g.small"

  validation {
    condition     = can(regex("^cache\\.", var.node_type))
    error_message = "node_type must be an ElastiCache node type (cache.*)."
  }
}

variable "num_cache_clusters" {
  type        = number
  description = "Nodes in the replication group: 1 in dev; 2 or more turns on automatic failover and Multi-AZ."
  default     = 1

  validation {
    condition     = var.num_cache_clusters >= 1 && var.num_cache_clusters <= 6
    error_message = "num_cache_clusters must be between 1 and 6."
  }
}

variable "snapshot_retention_days" {
  type        = number
  description = "Days of automatic snapshots (queued tasks and job records survive a total loss)."
  default     = 7

  validation {
    condition     = var.snapshot_retention_days >= 1 && var.snapshot_retention_days <= 35
    error_message = "snapshot_retention_days must be between 1 and 35."
  }
}

variable "auth_token_rotation" {
  type        = string
  description = "Change this value to rotate the auth token; ElastiCache keeps the old token valid (ROTATE) until the next apply."
  default     = "1"
}

variable "log_group_kms_key_arn" {
  type        = string
  description = "KMS key for the slow-log and engine-log groups."
}

variable "log_retention_days" {
  type        = number
  description = "Retention of the Redis log groups in days."
  default     = 30
}

variable "alarm_topic_arn" {
  type        = string
  description = "SNS topic for the memory alarm (a broker with noeviction rejects writes when full)."
}

variable "memory_alarm_percent" {
  type        = number
  description = "Alarm when used memory passes this percentage of maxmemory."
  default     = 75

  validation {
    condition     = var.memory_alarm_percent > 0 && var.memory_alarm_percent < 100
    error_message = "memory_alarm_percent must be in (0, 100)."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (the provider's default_tags carry the common ones)."
  default     = {}
}
