region      = "us-east-1"
environment = "prod"
app_version = "0.1.0"

certificate_arn = "arn:aws:acm:us-east-1:111122223333:certificate/00000000-0000-0000-0000-000000000000"

# engine: engine.auto.tfvars.json beside this file, written by `toolrail engine publish --tfvars`.

az_count                 = 3
nat_gateway_mode         = "per_az"
redis_node_type          = "cache.r7g.large"
redis_num_cache_clusters = 2
triton_min_capacity      = 1
triton_max_capacity      = 4
api_min_capacity         = 2
api_max_capacity         = 10
waf_enabled              = true
deletion_protection      = true
log_retention_days       = 90
scale_in_idle_minutes    = 15
queue_age_alarm_seconds  = 120
alarm_emails             = ["oncall@example.com"]

worker_groups = {
  decide = {
    queues           = ["decide"]
    cpu              = 1024
    memory           = 2048
    min_capacity     = 2
    max_capacity     = 16
    concurrency      = 16
    backlog_per_task = 32
    needs_triton     = true
  }
  readonly = {
    queues            = ["tool.get_weather", "tool.query_balance"]
    min_capacity      = 1
    max_capacity      = 20
    task_time_limit_s = 30
    internet_egress   = true
  }
  payments = {
    queues            = ["tool.transfer"]
    min_capacity      = 1
    max_capacity      = 4
    concurrency       = 2
    task_time_limit_s = 30
  }
}

dead_letter_queues = ["dead_letter"]
