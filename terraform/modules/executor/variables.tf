variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. toolrail-dev."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "environment" {
  type        = string
  description = "Environment name; the Environment dimension of the queue metrics."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the workers."
}

variable "vpc_cidr_block" {
  type        = string
  description = "VPC CIDR; workers reach the interface VPC endpoints on 443 inside it."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets for worker tasks and the metric publisher."
}

variable "s3_prefix_list_id" {
  type        = string
  description = "Prefix list of the S3 gateway endpoint (ECR image layers come from S3)."
}

variable "image" {
  type        = string
  description = "API/worker container image (docker/Dockerfile), pinned by tag or digest."

  validation {
    condition     = !endswith(var.image, ":latest")
    error_message = "Pin the image by version tag or digest, not :latest."
  }
}

variable "worker_groups" {
  type = map(object({
    queues            = list(string)
    cpu               = optional(number, 512)
    memory            = optional(number, 1024)
    min_capacity      = optional(number, 0)
    max_capacity      = optional(number, 4)
    concurrency       = optional(number, 4)
    task_time_limit_s = optional(number, 60)
    backlog_per_task  = optional(number, 20)
    internet_egress   = optional(bool, false)
    use_spot          = optional(bool, false)
    needs_triton      = optional(bool, false)
    environment       = optional(map(string), {})
    iam_statements = optional(list(object({
      sid       = string
      actions   = list(string)
      resources = list(string)
    })), [])
  }))
  description = "Celery worker services, one per tool-queue group: the queues it consumes (toolrail worker -Q), size, scaling bounds, hard time limit, egress and the AWS permissions of its own task role."

  validation {
    condition     = alltrue([for k, g in var.worker_groups : can(regex("^[a-z][a-z0-9-]{0,20}$", k))])
    error_message = "worker group names must be 1-21 lowercase letters, digits or hyphens."
  }

  validation {
    condition     = alltrue([for g in var.worker_groups : length(g.queues) >= 1 && length(g.queues) <= 8])
    error_message = "every worker group consumes 1 to 8 queues (alarm metric math allows 10 metrics)."
  }

  validation {
    condition     = alltrue([for g in var.worker_groups : g.min_capacity >= 0 && g.min_capacity <= g.max_capacity])
    error_message = "min_capacity must be >= 0 and <= max_capacity."
  }

  validation {
    condition     = alltrue([for g in var.worker_groups : g.task_time_limit_s >= 1 && g.task_time_limit_s <= 100])
    error_message = "task_time_limit_s must be 1-100 s so a running task finishes inside the 120 s Fargate stop timeout on scale-in."
  }
}

variable "dead_letter_queues" {
  type        = list(string)
  description = "Extra queues the publisher measures (no workers consume them), e.g. a dead-letter queue."
  default     = []
}

variable "scale_in_idle_minutes" {
  type        = number
  description = "Minutes the backlog per task must stay low before a worker service sheds a task (eventually down to min_capacity, 0 when idle)."
  default     = 10

  validation {
    condition     = var.scale_in_idle_minutes >= 2 && var.scale_in_idle_minutes <= 60
    error_message = "scale_in_idle_minutes must be between 2 and 60."
  }
}

variable "redis_client_security_group_id" {
  type        = string
  description = "Security group that may reach Redis (the redis module's client group)."
}

variable "redis_host" {
  type        = string
  description = "Redis primary endpoint, for the metric publisher."
}

variable "redis_port" {
  type        = number
  description = "Redis port."
  default     = 6379
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
  description = "KMS key of the Redis secret; execution roles decrypt with it."
}

variable "triton_url" {
  type        = string
  description = "host:port of Triton's gRPC endpoint for groups with needs_triton (TOOLRAIL_TRITON_URL)."
  default     = ""
}

variable "triton_model" {
  type        = string
  description = "Triton model the decide workers call (TOOLRAIL_TRITON_MODEL): the decider module's triton_model output, which follows the model repository flavour."
  default     = "llmapi"

  validation {
    condition     = contains(["llmapi", "tensorrt_llm_bls"], var.triton_model)
    error_message = "triton_model must be llmapi (pytorch flavour) or tensorrt_llm_bls (engine flavour)."
  }
}

variable "triton_client_security_group_id" {
  type        = string
  description = "Security group that may reach Triton gRPC; attached to groups with needs_triton. Empty when there is no Triton."
  default     = ""
}

variable "log_group_names" {
  type        = map(string)
  description = "Log group per service from the observability module; needs worker-<group> for every group and queue-metrics."
}

variable "log_group_arns" {
  type        = map(string)
  description = "Log group ARNs per service, matching log_group_names."
}

variable "container_insights" {
  type        = string
  description = "ECS Container Insights mode (enabled or enhanced); scaling reads RunningTaskCount from it."
  default     = "enabled"

  validation {
    condition     = contains(["enabled", "enhanced"], var.container_insights)
    error_message = "container_insights must be enabled or enhanced (scaling needs RunningTaskCount)."
  }
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (the provider's default_tags carry the common ones)."
  default     = {}
}
