provider "aws" {
  region = var.region

  default_tags {
    tags = {
      Project     = "toolrail"
      Environment = var.environment
      ManagedBy   = "terraform"
      Repository  = "toolrail/terraform/envs/${var.environment}"
    }
  }
}

data "aws_caller_identity" "current" {}

locals {
  name         = "toolrail-${var.environment}"
  registry     = "${data.aws_caller_identity.current.account_id}.dkr.ecr.${var.region}.amazonaws.com"
  app_image    = var.app_image != "" ? var.app_image : "${local.registry}/toolrail:${var.app_version}"
  triton_image = var.triton_image != "" ? var.triton_image : "${local.registry}/toolrail-triton:${var.app_version}-trtllm${var.triton_trtllm_version}"
  services     = concat(["api", "triton", "queue-metrics"], [for group in keys(var.worker_groups) : "worker-${group}"])
  all_queues   = distinct(concat(flatten([for group in values(var.worker_groups) : group.queues]), var.dead_letter_queues))
}

module "observability" {
  source = "../../modules/observability"

  name                         = local.name
  environment                  = var.environment
  services                     = local.services
  log_retention_days           = var.log_retention_days
  queue_names                  = local.all_queues
  dead_letter_queues           = var.dead_letter_queues
  queue_age_alarm_seconds      = var.queue_age_alarm_seconds
  alb_arn_suffix               = module.api.alb_arn_suffix
  needs_review_alarm_threshold = var.needs_review_alarm_threshold
  alarm_emails                 = var.alarm_emails
}

module "network" {
  source = "../../modules/network"

  name                 = local.name
  cidr_block           = var.vpc_cidr_block
  az_count             = var.az_count
  nat_gateway_mode     = var.nat_gateway_mode
  flow_log_kms_key_arn = module.observability.kms_key_arn
}

module "redis" {
  source = "../../modules/redis"

  name                  = local.name
  vpc_id                = module.network.vpc_id
  subnet_ids            = module.network.private_subnet_ids
  node_type             = var.redis_node_type
  num_cache_clusters    = var.redis_num_cache_clusters
  log_group_kms_key_arn = module.observability.kms_key_arn
  alarm_topic_arn       = module.observability.alarm_topic_arn
}

module "decider" {
  source = "../../modules/decider"

  name                  = local.name
  environment           = var.environment
  vpc_id                = module.network.vpc_id
  vpc_cidr_block        = module.network.vpc_cidr_block
  subnet_ids            = module.network.gpu_subnet_ids
  s3_prefix_list_id     = module.network.s3_prefix_list_id
  triton_image          = local.triton_image
  triton_trtllm_version = var.triton_trtllm_version
  engine                = var.engine
  min_capacity          = var.triton_min_capacity
  max_capacity          = var.triton_max_capacity
  deletion_protection   = var.deletion_protection
  log_group_name        = module.observability.log_group_names["triton"]
  lb_logs_bucket        = module.observability.lb_logs_bucket
  alarm_topic_arn       = module.observability.alarm_topic_arn
}

module "executor" {
  source = "../../modules/executor"

  name                            = local.name
  environment                     = var.environment
  vpc_id                          = module.network.vpc_id
  vpc_cidr_block                  = module.network.vpc_cidr_block
  subnet_ids                      = module.network.private_subnet_ids
  s3_prefix_list_id               = module.network.s3_prefix_list_id
  image                           = local.app_image
  worker_groups                   = var.worker_groups
  dead_letter_queues              = var.dead_letter_queues
  scale_in_idle_minutes           = var.scale_in_idle_minutes
  redis_client_security_group_id  = module.redis.client_security_group_id
  redis_host                      = module.redis.primary_endpoint_address
  redis_port                      = module.redis.port
  redis_auth_secret_arn           = module.redis.auth_secret_arn
  redis_url_secret_value_from     = module.redis.url_secret_value_from
  redis_kms_key_arn               = module.redis.kms_key_arn
  triton_url                      = module.decider.triton_grpc_url
  triton_model                    = module.decider.triton_model
  triton_client_security_group_id = module.decider.client_security_group_id
  log_group_names                 = module.observability.log_group_names
  log_group_arns                  = module.observability.log_group_arns
}

module "api" {
  source = "../../modules/api"

  name                           = local.name
  environment                    = var.environment
  vpc_id                         = module.network.vpc_id
  vpc_cidr_block                 = module.network.vpc_cidr_block
  public_subnet_ids              = module.network.public_subnet_ids
  private_subnet_ids             = module.network.private_subnet_ids
  s3_prefix_list_id              = module.network.s3_prefix_list_id
  cluster_arn                    = module.executor.cluster_arn
  cluster_name                   = module.executor.cluster_name
  image                          = local.app_image
  certificate_arn                = var.certificate_arn
  allowed_ingress_cidrs          = var.allowed_ingress_cidrs
  waf_enabled                    = var.waf_enabled
  waf_log_group_arn              = module.observability.waf_log_group_arn
  deletion_protection            = var.deletion_protection
  min_capacity                   = var.api_min_capacity
  max_capacity                   = var.api_max_capacity
  redis_client_security_group_id = module.redis.client_security_group_id
  redis_auth_secret_arn          = module.redis.auth_secret_arn
  redis_url_secret_value_from    = module.redis.url_secret_value_from
  redis_kms_key_arn              = module.redis.kms_key_arn
  log_group_name                 = module.observability.log_group_names["api"]
  lb_logs_bucket                 = module.observability.lb_logs_bucket
}

# A build whose model the server downloads itself (publish --hub-egress) needs a route out of the GPU subnets.
check "hub_egress_has_a_route" {
  assert {
    condition     = !var.engine.hub_egress || var.nat_gateway_mode != "none"
    error_message = "engine.hub_egress needs a NAT gateway (nat_gateway_mode single or per_az): the GPU subnets have no other route to a model hub."
  }
}
