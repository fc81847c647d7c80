data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  multi_node = var.num_cache_clusters > 1
  # ElastiCache names member clusters <replication group id>-001, -002, ...
  member_cluster_ids = [for i in range(var.num_cache_clusters) : format("%s-%03d", aws_elasticache_replication_group.this.id, i + 1)]
  # Celery and redis-py both read ssl_cert_reqs from a rediss:// URL; kombu refuses rediss without it.
  redis_url = "rediss://:${random_password.auth.result}@${aws_elasticache_replication_group.this.primary_endpoint_address}:6379/0?ssl_cert_reqs=required"
}

# --- Encryption at rest for the cache, its snapshots and the auth token secret. ---

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:Key policy, not an identity policy: Resource "*" means this key, and the account-root statement is the AWS default that delegates access to IAM.
  #checkov:skip=CKV_AWS_111:Key policy, not an identity policy: Resource "*" means this key; service statements are scoped by principal and condition.
  #checkov:skip=CKV_AWS_356:Key policy, not an identity policy: Resource "*" means this key and cannot be narrowed further.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: ElastiCache data at rest and the Redis auth secret"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json

  tags = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-redis"
  target_key_id = aws_kms_key.this.key_id
}

# --- Auth token: generated here, kept in Secrets Manager, never in a variable or an output. ---

resource "random_password" "auth" {
  length  = 64
  special = false

  keepers = {
    rotation = var.auth_token_rotation
  }
}

resource "aws_secretsmanager_secret" "auth" {
  #checkov:skip=CKV2_AWS_57:The token is rotated through Terraform (auth_token_rotation + auth_token_update_strategy ROTATE); a Lambda rotator would change the secret without changing the replication group.
  name_prefix             = "${var.name}/redis-"
  description             = "Redis AUTH token and rediss:// URL for toolrail (JSON keys auth_token, url)"
  kms_key_id              = aws_kms_key.this.arn
  recovery_window_in_days = 7

  tags = var.tags
}

resource "aws_secretsmanager_secret_version" "auth" {
  secret_id = aws_secretsmanager_secret.auth.id
  secret_string = jsonencode({
    auth_token = random_password.auth.result
    url        = local.redis_url
  })
}

# --- Network ---

resource "aws_elasticache_subnet_group" "this" {
  name       = "${var.name}-redis"
  subnet_ids = var.subnet_ids

  tags = var.tags
}

resource "aws_security_group" "redis" {
  name_prefix = "${var.name}-redis-"
  description = "ElastiCache for Redis: TLS port 6379 from toolrail clients only"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-redis" })

  lifecycle {
    create_before_destroy = true
  }
}

# Tasks that talk to Redis wear this group; Redis admits only it.
resource "aws_security_group" "client" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module, by the executor and api modules, to every task that talks to Redis.
  name_prefix = "${var.name}-redis-client-"
  description = "Attach to tasks that use Redis; allows TLS 6379 to the cache"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-redis-client" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_clients" {
  security_group_id            = aws_security_group.redis.id
  description                  = "Redis TLS from toolrail clients"
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
  referenced_security_group_id = aws_security_group.client.id
}

resource "aws_vpc_security_group_egress_rule" "client_to_redis" {
  security_group_id            = aws_security_group.client.id
  description                  = "Redis TLS to the cache"
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
  referenced_security_group_id = aws_security_group.redis.id
}

# --- The cache ---

# A broker must never evict: an evicted list is a lost queue of tasks. Writes fail loudly instead
# (see the memory alarm below).
resource "aws_elasticache_parameter_group" "this" {
  name        = "${var.name}-redis"
  family      = var.parameter_group_family
  description = "toolrail broker and job store: noeviction"

  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }

  # Celery's broker connections are long-lived; drop idle ones after an hour, not never.
  parameter {
    name  = "timeout"
    value = "3600"
  }

  tags = var.tags
}

resource "aws_cloudwatch_log_group" "redis" {
  #checkov:skip=CKV_AWS_338:Slow-log and engine-log are short-lived diagnostics; retention is var.log_retention_days, a year of them is cost without audit value.
  for_each = toset(["slow-log", "engine-log"])

  name              = "/toolrail/${var.name}/redis/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_group_kms_key_arn

  tags = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = "${var.name}-redis"
  description          = "toolrail Celery broker, result backend and job store"

  engine               = "redis"
  engine_version       = var.engine_version
  node_type            = var.node_type
  port                 = 6379
  parameter_group_name = aws_elasticache_parameter_group.this.name
  subnet_group_name    = aws_elasticache_subnet_group.this.name
  security_group_ids   = [aws_security_group.redis.id]

  num_cache_clusters         = var.num_cache_clusters
  automatic_failover_enabled = local.multi_node
  multi_az_enabled           = local.multi_node

  at_rest_encryption_enabled = true
  kms_key_id                 = aws_kms_key.this.arn
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = random_password.auth.result
  auth_token_update_strategy = "ROTATE"

  snapshot_retention_limit   = var.snapshot_retention_days
  snapshot_window            = "03:00-04:00"
  maintenance_window         = "sun:05:00-sun:06:00"
  auto_minor_version_upgrade = true
  apply_immediately          = false

  log_delivery_configuration {
    destination      = aws_cloudwatch_log_group.redis["slow-log"].name
    destination_type = "cloudwatch-logs"
    log_format       = "json"
    log_type         = "slow-log"
  }

  log_delivery_configuration {
    destination      = aws_cloudwatch_log_group.redis["engine-log"].name
    destination_type = "cloudwatch-logs"
    log_format       = "json"
    log_type         = "engine-log"
  }

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "memory" {
  count = var.num_cache_clusters

  alarm_name          = "${var.name}-redis-memory-${count.index + 1}"
  alarm_description   = "Redis node ${local.member_cluster_ids[count.index]} uses more than ${var.memory_alarm_percent}% of maxmemory; with noeviction, enqueues fail at 100%."
  namespace           = "AWS/ElastiCache"
  metric_name         = "DatabaseMemoryUsagePercentage"
  dimensions          = { CacheClusterId = local.member_cluster_ids[count.index] }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 2
  threshold           = var.memory_alarm_percent
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "breaching"
  alarm_actions       = [var.alarm_topic_arn]
  ok_actions          = [var.alarm_topic_arn]

  tags = var.tags
}
