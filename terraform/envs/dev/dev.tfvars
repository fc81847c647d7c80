region      = "us-east-1"
environment = "dev"
app_version = "0.1.0"

# From the ACM console or `aws acm list-certificates`; the API's DNS name must match it.
certificate_arn = "arn:aws:acm:us-east-1:111122223333:certificate/00000000-0000-0000-0000-000000000000"

# engine: engine.auto.tfvars.json beside this file, written by `toolrail engine publish --tfvars`.

nat_gateway_mode         = "single"
redis_node_type          = "cache.t4g.small"
redis_num_cache_clusters = 1
triton_min_capacity      = 1
triton_max_capacity      = 1
api_min_capacity         = 1
api_max_capacity         = 2
waf_enabled              = true
deletion_protection      = false
log_retention_days       = 14
scale_in_idle_minutes    = 5

# Every tool worker group idles at zero tasks in dev; the first queued message starts one.
worker_groups = {
  decide = {
    queues       = ["decide"]
    min_capacity = 0
    max_capacity = 2
    needs_triton = true
    use_spot     = true
  }
  readonly = {
    queues            = ["tool.get_weather", "tool.query_balance"]
    min_capacity      = 0
    max_capacity      = 2
    task_time_limit_s = 30
    internet_egress   = true
    use_spot          = true
  }
  payments = {
    queues            = ["tool.transfer"]
    min_capacity      = 0
    max_capacity      = 1
    concurrency       = 2
    task_time_limit_s = 30
  }
}

dead_letter_queues = ["dead_letter"]
