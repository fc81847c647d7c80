variable "region" {
  type        = string
  description = "AWS region of the stack."
}

variable "environment" {
  type        = string
  description = "Environment name; part of every resource name (toolrail-<environment>)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{1,9}$", var.environment))
    error_message = "environment must be 2-10 lowercase letters or digits."
  }
}

variable "app_version" {
  type        = string
  description = "Version tag of the images in ECR (toolrail:<app_version>, toolrail-triton:<app_version>-trtllm<version>)."
}

variable "app_image" {
  type        = string
  description = "Full API/worker image reference; empty derives <account>.dkr.ecr.<region>.amazonaws.com/toolrail:<app_version>."
  default     = ""
}

variable "triton_image" {
  type        = string
  description = "Full Triton image reference; empty derives it from the account's ECR, app_version and triton_trtllm_version."
  default     = ""
}

variable "triton_trtllm_version" {
  type        = string
  description = "TensorRT-LLM version pinned in docker/Dockerfile.triton."
  default     = "1.0.0"
}

variable "engine" {
  type = object({
    build_key       = string
    gpu             = string
    sm              = number
    trtllm_version  = string
    backend         = optional(string, "pytorch")
    task_memory_mib = number
    hub_egress      = optional(bool, false)
  })
  description = "Build to serve: the deploy block of the publish manifest, written to engine.auto.tfvars.json by `toolrail engine publish --tfvars` (build_key, gpu, sm, trtllm_version, backend, task_memory_mib, hub_egress)."
}

variable "certificate_arn" {
  type        = string
  description = "ACM certificate ARN for the API's HTTPS listener."
}

variable "allowed_ingress_cidrs" {
  type        = list(string)
  description = "Client CIDRs allowed to reach the API load balancer on 443."
  default     = ["0.0.0.0/0"]
}

variable "vpc_cidr_block" {
  type        = string
  description = "IPv4 CIDR of the VPC."
  default     = "10.40.0.0/16"
}

variable "az_count" {
  type        = number
  description = "Availability zones to use."
  default     = 2
}

variable "nat_gateway_mode" {
  type        = string
  description = "none, single or per_az NAT gateways for tools that call external APIs."
  default     = "single"
}

variable "redis_node_type" {
  type        = string
  description = "ElastiCache node type."
  default     = "cache.t4g.small"
}

variable "redis_num_cache_clusters" {
  type        = number
  description = "Redis nodes; 2 or more enables automatic failover and Multi-AZ."
  default     = 1
}

variable "triton_min_capacity" {
  type        = number
  description = "Minimum Triton tasks (GPU instances)."
  default     = 1
}

variable "triton_max_capacity" {
  type        = number
  description = "Maximum Triton tasks (GPU instances)."
  default     = 2
}

variable "api_min_capacity" {
  type        = number
  description = "Minimum API tasks."
  default     = 1
}

variable "api_max_capacity" {
  type        = number
  description = "Maximum API tasks."
  default     = 4
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
  description = "Celery worker services per tool-queue group (see modules/executor)."
}

variable "dead_letter_queues" {
  type        = list(string)
  description = "Queues that hold failed work only; measured and alarmed on, never consumed."
  default     = []
}

variable "scale_in_idle_minutes" {
  type        = number
  description = "Minutes of low backlog before a worker service sheds a task."
  default     = 10
}

variable "queue_age_alarm_seconds" {
  type        = number
  description = "Alarm when a queue's oldest message is older than this."
  default     = 300
}

variable "needs_review_alarm_threshold" {
  type        = number
  description = "Alarm when more jobs than this end in needs_review within 15 minutes."
  default     = 10
}

variable "log_retention_days" {
  type        = number
  description = "Retention of application logs in days."
  default     = 30
}

variable "waf_enabled" {
  type        = bool
  description = "Attach the WAF web ACL to the API load balancer."
  default     = true
}

variable "deletion_protection" {
  type        = bool
  description = "Deletion protection on the load balancers."
  default     = true
}

variable "alarm_emails" {
  type        = list(string)
  description = "Addresses subscribed to the alarm topic."
  default     = []
}
