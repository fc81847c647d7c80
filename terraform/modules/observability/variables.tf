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
  description = "Environment name; the Environment dimension of the toolrail queue metrics."
}

variable "services" {
  type        = list(string)
  description = "Services that get a log group /toolrail/<name>/<service>, e.g. api, worker-decide, triton."

  validation {
    condition     = length(var.services) > 0 && alltrue([for s in var.services : can(regex("^[a-z0-9-]+$", s))])
    error_message = "services must be a non-empty list of lowercase names (letters, digits, hyphens)."
  }
}

variable "log_retention_days" {
  type        = number
  description = "Retention of application log groups in days."
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch Logs accepts."
  }
}

variable "lb_log_retention_days" {
  type        = number
  description = "Days load balancer access logs stay in the S3 bucket before they expire."
  default     = 90

  validation {
    condition     = var.lb_log_retention_days >= 1
    error_message = "lb_log_retention_days must be at least 1."
  }
}

variable "queue_names" {
  type        = list(string)
  description = "Celery queues watched for age (QueueOldestAgeSeconds from the metric publisher)."
}

variable "dead_letter_queues" {
  type        = list(string)
  description = "Queues that only fill with failed work; any message there raises an alarm."
  default     = []
}

variable "queue_age_alarm_seconds" {
  type        = number
  description = "Alarm when the oldest message of a queue has waited longer than this."
  default     = 300

  validation {
    condition     = var.queue_age_alarm_seconds >= 60
    error_message = "queue_age_alarm_seconds must be at least 60 (the publisher runs once a minute)."
  }
}

variable "alb_arn_suffix" {
  type        = string
  description = "ARN suffix of the API load balancer, for the 5xx error-rate alarm."
}

variable "error_rate_alarm_percent" {
  type        = number
  description = "Alarm when more than this percentage of API requests end in a 5xx over five minutes."
  default     = 5

  validation {
    condition     = var.error_rate_alarm_percent > 0 && var.error_rate_alarm_percent <= 100
    error_message = "error_rate_alarm_percent must be in (0, 100]."
  }
}

variable "error_log_alarm_threshold" {
  type        = number
  description = "Alarm when more error-level log lines than this appear in five minutes across all services."
  default     = 50
}

variable "needs_review_filter_pattern" {
  type        = string
  description = "CloudWatch Logs filter pattern matching the log line written when a job ends in needs_review."
  default     = "{ $.status = \"needs_review\" }"
}

variable "needs_review_alarm_threshold" {
  type        = number
  description = "Alarm when more jobs than this end in needs_review within fifteen minutes."
  default     = 10
}

variable "alarm_emails" {
  type        = list(string)
  description = "Addresses subscribed to the alarm topic (each must confirm the subscription)."
  default     = []
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (the provider's default_tags carry the common ones)."
  default     = {}
}

variable "metrics_scrape_targets" {
  type        = list(string)
  description = "host:port of each API task whose /metrics the collector scrapes (from inside the task: localhost:8000)."
  default     = ["localhost:8000"]
}

variable "metrics_scrape_interval_s" {
  type        = number
  description = "Seconds between scrapes of the API's /metrics."
  default     = 30

  validation {
    condition     = var.metrics_scrape_interval_s >= 5 && var.metrics_scrape_interval_s <= 300
    error_message = "metrics_scrape_interval_s must be between 5 and 300."
  }
}
