data "aws_caller_identity" "current" {}

data "aws_region" "current" {}

data "aws_partition" "current" {}

data "aws_elb_service_account" "current" {}

locals {
  account_id    = data.aws_caller_identity.current.account_id
  region        = data.aws_region.current.name
  partition     = data.aws_partition.current.partition
  log_namespace = "toolrail/${var.name}"
}

# --- One key for everything this module stores: log groups and the alarm topic. ---

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
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:root"]
    }
  }

  statement {
    sid = "CloudWatchLogsEncrypt"
    actions = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${local.region}.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:*"]
    }
  }

  statement {
    sid       = "CloudWatchAlarmsPublish"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["cloudwatch.amazonaws.com"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: CloudWatch log groups and the alarm topic"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json

  tags = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-observability"
  target_key_id = aws_kms_key.this.key_id
}

# --- Log groups: JSON lines from structlog, one group per service. ---

resource "aws_cloudwatch_log_group" "service" {
  #checkov:skip=CKV_AWS_338:Retention is var.log_retention_days per environment (dev 14, prod 90); long-term audit belongs in CloudTrail, not application logs.
  for_each = toset(var.services)

  name              = "/toolrail/${var.name}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn

  tags = merge(var.tags, { Service = each.key })
}

# WAF requires the aws-waf-logs- prefix.
resource "aws_cloudwatch_log_group" "waf" {
  name              = "aws-waf-logs-${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn

  tags = var.tags
}

# Every log line carries request_id, so one saved query follows a request through all services.
resource "aws_cloudwatch_query_definition" "by_request_id" {
  name            = "toolrail/${var.name}/by-request-id"
  log_group_names = [for group in aws_cloudwatch_log_group.service : group.name]
  query_string    = <<-EOT
    fields @timestamp, @logGroup, level, event, request_id, job_id, tool
    | filter request_id = "REPLACE_WITH_REQUEST_ID"
    | sort @timestamp asc
    | limit 1000
  EOT
}

resource "aws_cloudwatch_query_definition" "errors" {
  name            = "toolrail/${var.name}/errors"
  log_group_names = [for group in aws_cloudwatch_log_group.service : group.name]
  query_string    = <<-EOT
    fields @timestamp, @logGroup, request_id, event, error
    | filter level = "error"
    | stats count(*) as errors by bin(5m), @logGroup
  EOT
}

resource "aws_cloudwatch_log_metric_filter" "errors" {
  for_each = aws_cloudwatch_log_group.service

  name           = "${var.name}-${each.key}-errors"
  log_group_name = each.value.name
  pattern        = "{ $.level = \"error\" }"

  metric_transformation {
    namespace     = local.log_namespace
    name          = "ErrorLogLines"
    value         = "1"
    default_value = "0"
  }
}

resource "aws_cloudwatch_log_metric_filter" "needs_review" {
  for_each = aws_cloudwatch_log_group.service

  name           = "${var.name}-${each.key}-needs-review"
  log_group_name = each.value.name
  pattern        = var.needs_review_filter_pattern

  metric_transformation {
    namespace     = local.log_namespace
    name          = "NeedsReviewJobs"
    value         = "1"
    default_value = "0"
  }
}

# --- Alarm topic ---

resource "aws_sns_topic" "alarms" {
  name              = "${var.name}-alarms"
  kms_master_key_id = aws_kms_key.this.arn

  tags = var.tags
}

resource "aws_sns_topic_subscription" "email" {
  for_each = toset(var.alarm_emails)

  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = each.key
}

# --- Alarms ---

resource "aws_cloudwatch_metric_alarm" "queue_age" {
  for_each = toset(var.queue_names)

  alarm_name          = "${var.name}-queue-age-${each.key}"
  alarm_description   = "Oldest message on Celery queue ${each.key} waited more than ${var.queue_age_alarm_seconds}s: workers are missing, stuck or too few."
  namespace           = "toolrail"
  metric_name         = "QueueOldestAgeSeconds"
  dimensions          = { Environment = var.environment, Queue = each.key }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  threshold           = var.queue_age_alarm_seconds
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "breaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "dead_letter" {
  for_each = toset(var.dead_letter_queues)

  alarm_name          = "${var.name}-dead-letter-${each.key}"
  alarm_description   = "Messages are arriving on dead-letter queue ${each.key}."
  namespace           = "toolrail"
  metric_name         = "QueueDepth"
  dimensions          = { Environment = var.environment, Queue = each.key }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "needs_review" {
  alarm_name          = "${var.name}-needs-review-growth"
  alarm_description   = "More than ${var.needs_review_alarm_threshold} jobs ended in needs_review within 15 minutes: tool calls keep failing validation after re-asks."
  namespace           = local.log_namespace
  metric_name         = "NeedsReviewJobs"
  statistic           = "Sum"
  period              = 900
  evaluation_periods  = 1
  threshold           = var.needs_review_alarm_threshold
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "error_logs" {
  alarm_name          = "${var.name}-error-log-lines"
  alarm_description   = "More than ${var.error_log_alarm_threshold} error-level log lines in five minutes across toolrail services."
  namespace           = local.log_namespace
  metric_name         = "ErrorLogLines"
  statistic           = "Sum"
  period              = 300
  evaluation_periods  = 1
  threshold           = var.error_log_alarm_threshold
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "api_error_rate" {
  alarm_name          = "${var.name}-api-5xx-rate"
  alarm_description   = "More than ${var.error_rate_alarm_percent}% of API requests returned 5xx over five minutes."
  evaluation_periods  = 5
  datapoints_to_alarm = 5
  threshold           = var.error_rate_alarm_percent
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  metric_query {
    id          = "rate"
    expression  = "IF(requests > 0, 100 * (FILL(target5xx, 0) + FILL(elb5xx, 0)) / requests, 0)"
    label       = "5xx percent"
    return_data = true
  }

  metric_query {
    id = "requests"

    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "RequestCount"
      dimensions  = { LoadBalancer = var.alb_arn_suffix }
      stat        = "Sum"
      period      = 60
    }
  }

  metric_query {
    id = "target5xx"

    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "HTTPCode_Target_5XX_Count"
      dimensions  = { LoadBalancer = var.alb_arn_suffix }
      stat        = "Sum"
      period      = 60
    }
  }

  metric_query {
    id = "elb5xx"

    metric {
      namespace   = "AWS/ApplicationELB"
      metric_name = "HTTPCode_ELB_5XX_Count"
      dimensions  = { LoadBalancer = var.alb_arn_suffix }
      stat        = "Sum"
      period      = 60
    }
  }

  tags = var.tags
}

# --- Load balancer access logs (ALB and NLB) ---

resource "aws_s3_bucket" "lb_logs" {
  #checkov:skip=CKV_AWS_145:Elastic Load Balancing delivers access logs only to buckets encrypted with SSE-S3, not SSE-KMS.
  #checkov:skip=CKV_AWS_18:This is the access-log bucket itself; logging it into another bucket would only move the question.
  #checkov:skip=CKV_AWS_144:Access logs are diagnostics kept for lb_log_retention_days; cross-region replication adds cost, not recovery.
  #checkov:skip=CKV2_AWS_62:Nothing consumes object events from the access-log bucket.
  bucket_prefix = "${var.name}-lb-logs-"
  force_destroy = false

  tags = var.tags
}

resource "aws_s3_bucket_ownership_controls" "lb_logs" {
  bucket = aws_s3_bucket.lb_logs.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "lb_logs" {
  bucket                  = aws_s3_bucket.lb_logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "lb_logs" {
  bucket = aws_s3_bucket.lb_logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "lb_logs" {
  bucket = aws_s3_bucket.lb_logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "lb_logs" {
  bucket = aws_s3_bucket.lb_logs.id

  rule {
    id     = "expire-access-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.lb_log_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 7
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

data "aws_iam_policy_document" "lb_logs" {
  statement {
    sid       = "ElbLogDeliveryLegacyRegions"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.lb_logs.arn}/*/AWSLogs/${local.account_id}/*"]

    principals {
      type        = "AWS"
      identifiers = [data.aws_elb_service_account.current.arn]
    }
  }

  statement {
    sid       = "ElbLogDelivery"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.lb_logs.arn}/*/AWSLogs/${local.account_id}/*"]

    principals {
      type        = "Service"
      identifiers = ["logdelivery.elasticloadbalancing.amazonaws.com"]
    }
  }

  statement {
    sid       = "S3ServerAccessLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.lb_logs.arn}/s3-access/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.lb_logs.arn, "${aws_s3_bucket.lb_logs.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "lb_logs" {
  bucket = aws_s3_bucket.lb_logs.id
  policy = data.aws_iam_policy_document.lb_logs.json

  depends_on = [aws_s3_bucket_public_access_block.lb_logs]
}

# --- Metrics: the API's /metrics scrape lands in Amazon Managed Service for Prometheus; the Grafana ---
# --- dashboard beside this file (dashboards/toolrail.json) reads it. Spans go to the OTLP collector  ---
# --- named by OTEL_EXPORTER_OTLP_ENDPOINT (docs/observability.md), not through this module.          ---

resource "aws_cloudwatch_log_group" "prometheus" {
  #checkov:skip=CKV_AWS_338:Retention is var.log_retention_days per environment (dev 14, prod 90); these are the workspace's own ingestion logs.
  name              = "/aws/prometheus/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.this.arn

  tags = var.tags
}

resource "aws_prometheus_workspace" "this" {
  alias       = var.name
  kms_key_arn = aws_kms_key.this.arn

  logging_configuration {
    log_group_arn = "${aws_cloudwatch_log_group.prometheus.arn}:*"
  }

  tags = var.tags
}

locals {
  dashboard_json = file("${path.module}/dashboards/toolrail.json")
  # An OpenTelemetry (ADOT) collector config for a sidecar next to the API: scrape /metrics with the
  # metrics bearer key (TOOLRAIL_METRICS_KEY, mounted as a file) and remote-write to the workspace.
  metrics_collector_config = yamlencode({
    extensions = { sigv4auth = { region = local.region, service = "aps" } }
    receivers = {
      prometheus = {
        config = {
          scrape_configs = [{
            job_name          = "toolrail-api"
            scrape_interval   = "${var.metrics_scrape_interval_s}s"
            metrics_path      = "/metrics"
            bearer_token_file = "/run/secrets/toolrail-metrics-key"
            static_configs    = [{ targets = var.metrics_scrape_targets }]
          }]
        }
      }
    }
    exporters = {
      prometheusremotewrite = {
        endpoint = "${aws_prometheus_workspace.this.prometheus_endpoint}api/v1/remote_write"
        auth     = { authenticator = "sigv4auth" }
      }
    }
    service = {
      extensions = ["sigv4auth"]
      pipelines  = { metrics = { receivers = ["prometheus"], exporters = ["prometheusremotewrite"] } }
    }
  })
}
