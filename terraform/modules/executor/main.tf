data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  region     = data.aws_region.current.name
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  measured_queues = distinct(concat(flatten([for g in var.worker_groups : g.queues]), var.dead_letter_queues))
  internet_groups = { for k, g in var.worker_groups : k => g if g.internet_egress }
  iam_groups      = { for k, g in var.worker_groups : k => g if length(g.iam_statements) > 0 }
  # ECS stops a task with SIGTERM (Celery warm shutdown: finish running tasks), then SIGKILL.
  stop_timeout_s = 120
}

# --- Cluster: Fargate for workers and the API; Container Insights feeds RunningTaskCount. ---

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = var.container_insights
  }

  tags = var.tags
}

resource "aws_ecs_cluster_capacity_providers" "this" {
  cluster_name       = aws_ecs_cluster.this.name
  capacity_providers = ["FARGATE", "FARGATE_SPOT"]

  default_capacity_provider_strategy {
    capacity_provider = "FARGATE"
    weight            = 1
  }
}

# --- IAM: one execution role (pull, logs, REDIS_URL) and one task role per worker group. ---

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "execution" {
  name_prefix        = "${var.name}-worker-exec-"
  description        = "ECS agent for toolrail workers: pull the image, write logs, read REDIS_URL"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "execution_secrets" {
  statement {
    sid       = "ReadRedisUrl"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.redis_auth_secret_arn]
  }

  statement {
    sid       = "DecryptRedisSecret"
    actions   = ["kms:Decrypt"]
    resources = [var.redis_kms_key_arn]
  }
}

resource "aws_iam_role_policy" "execution_secrets" {
  name   = "read-redis-secret"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secrets.json
}

# Least privilege: a worker group's role starts empty; iam_statements grant what its tools need.
resource "aws_iam_role" "task" {
  for_each = var.worker_groups

  name_prefix        = "${var.name}-${each.key}-"
  description        = "toolrail worker group ${each.key}: queues ${join(",", each.value.queues)}"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = merge(var.tags, { WorkerGroup = each.key })
}

data "aws_iam_policy_document" "task" {
  for_each = local.iam_groups

  dynamic "statement" {
    for_each = each.value.iam_statements

    content {
      sid       = statement.value.sid
      actions   = statement.value.actions
      resources = statement.value.resources
    }
  }
}

resource "aws_iam_role_policy" "task" {
  for_each = local.iam_groups

  name   = "tools-${each.key}"
  role   = aws_iam_role.task[each.key].id
  policy = data.aws_iam_policy_document.task[each.key].json
}

# --- Security groups: no ingress at all; egress only where a group needs it. ---

resource "aws_security_group" "worker" {
  for_each = var.worker_groups

  name_prefix = "${var.name}-${each.key}-"
  description = "toolrail worker group ${each.key}: egress only, no ingress"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-${each.key}", WorkerGroup = each.key })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "worker_endpoints" {
  for_each = var.worker_groups

  security_group_id = aws_security_group.worker[each.key].id
  description       = "HTTPS to the interface VPC endpoints"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = var.vpc_cidr_block
}

resource "aws_vpc_security_group_egress_rule" "worker_s3" {
  for_each = var.worker_groups

  security_group_id = aws_security_group.worker[each.key].id
  description       = "HTTPS to S3 through the gateway endpoint (image layers)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.s3_prefix_list_id
}

resource "aws_vpc_security_group_egress_rule" "worker_internet" {
  for_each = local.internet_groups

  security_group_id = aws_security_group.worker[each.key].id
  description       = "HTTPS to external tool APIs through the NAT gateway"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

# --- Task definitions and services, one per worker group ---

resource "aws_ecs_task_definition" "worker" {
  for_each = var.worker_groups

  family                   = "${var.name}-worker-${each.key}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = each.value.cpu
  memory                   = each.value.memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task[each.key].arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  # The root filesystem is read-only; tool sandboxes and caches write to this scratch volume.
  volume {
    name = "scratch"
  }

  container_definitions = jsonencode([{
    name                   = "worker"
    image                  = var.image
    essential              = true
    command                = ["toolrail", "worker", "-Q", join(",", each.value.queues)]
    readonlyRootFilesystem = true
    stopTimeout            = local.stop_timeout_s
    linuxParameters        = { initProcessEnabled = true }
    mountPoints            = [{ sourceVolume = "scratch", containerPath = "/tmp", readOnly = false }]
    environment = [for key, value in merge({
      TOOLRAIL_ENVIRONMENT          = var.environment
      TOOLRAIL_WORKER_GROUP         = each.key
      TOOLRAIL_WORKER_CONCURRENCY   = tostring(each.value.concurrency)
      TOOLRAIL_TASK_TIME_LIMIT_S    = tostring(each.value.task_time_limit_s)
      TOOLRAIL_CACHE_DIR            = "/tmp/toolrail"
      TOOLRAIL_LOG_FORMAT           = "json"
      TOOLRAIL_DECIDER              = each.value.needs_triton ? "triton" : "none"
      TOOLRAIL_TRITON_URL           = each.value.needs_triton ? var.triton_url : ""
      TOOLRAIL_TRITON_MODEL         = each.value.needs_triton ? var.triton_model : ""
      TOOLRAIL_VISIBILITY_TIMEOUT_S = "3600"
    }, each.value.environment) : { name = key, value = value }]
    secrets = [{ name = "REDIS_URL", valueFrom = var.redis_url_secret_value_from }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = var.log_group_names["worker-${each.key}"]
        awslogs-region        = local.region
        awslogs-stream-prefix = each.key
        mode                  = "non-blocking"
        max-buffer-size       = "4m"
      }
    }
  }])

  tags = merge(var.tags, { WorkerGroup = each.key })
}

resource "aws_ecs_service" "worker" {
  for_each = var.worker_groups

  name                   = "worker-${each.key}"
  cluster                = aws_ecs_cluster.this.id
  task_definition        = aws_ecs_task_definition.worker[each.key].arn
  desired_count          = each.value.min_capacity
  enable_execute_command = false
  propagate_tags         = "SERVICE"
  wait_for_steady_state  = false

  capacity_provider_strategy {
    capacity_provider = each.value.use_spot ? "FARGATE_SPOT" : "FARGATE"
    weight            = 1
  }

  network_configuration {
    subnets          = var.subnet_ids
    assign_public_ip = false
    security_groups = concat(
      [aws_security_group.worker[each.key].id, var.redis_client_security_group_id],
      each.value.needs_triton && var.triton_client_security_group_id != "" ? [var.triton_client_security_group_id] : [],
    )
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  tags = merge(var.tags, { WorkerGroup = each.key })

  # Application Auto Scaling owns the task count after creation.
  lifecycle {
    ignore_changes = [desired_count]
  }

  depends_on = [aws_ecs_cluster_capacity_providers.this]
}

# --- Scaling on queue depth: backlog per running task, from zero and back to zero. ---
#
# backlog = sum of LLEN over the group's queues (metric publisher, namespace toolrail)
# load    = backlog / running tasks, or backlog * backlog_per_task when no task runs, so any
#           message wakes an idle group. Target tracking cannot start from zero tasks, step
#           scaling can.

locals {
  scaling_queries = {
    for k, g in var.worker_groups : k => {
      queue_ids = [for i, q in g.queues : { id = "q${i}", queue = q }]
      load      = "IF(FILL(running, 0) < 1, (${join(" + ", [for i, q in g.queues : "FILL(q${i}, 0)"])}) * ${g.backlog_per_task}, (${join(" + ", [for i, q in g.queues : "FILL(q${i}, 0)"])}) / running)"
    }
  }
}

resource "aws_appautoscaling_target" "worker" {
  for_each = var.worker_groups

  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.this.name}/${aws_ecs_service.worker[each.key].name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = each.value.min_capacity
  max_capacity       = each.value.max_capacity

  tags = merge(var.tags, { WorkerGroup = each.key })
}

resource "aws_appautoscaling_policy" "scale_out" {
  for_each = var.worker_groups

  name               = "${var.name}-${each.key}-scale-out"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.worker[each.key].service_namespace
  resource_id        = aws_appautoscaling_target.worker[each.key].resource_id
  scalable_dimension = aws_appautoscaling_target.worker[each.key].scalable_dimension

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = 60
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_lower_bound = 0
      metric_interval_upper_bound = each.value.backlog_per_task
      scaling_adjustment          = 1
    }

    step_adjustment {
      metric_interval_lower_bound = each.value.backlog_per_task
      metric_interval_upper_bound = each.value.backlog_per_task * 4
      scaling_adjustment          = 2
    }

    step_adjustment {
      metric_interval_lower_bound = each.value.backlog_per_task * 4
      scaling_adjustment          = 4
    }
  }
}

resource "aws_appautoscaling_policy" "scale_in" {
  for_each = var.worker_groups

  name               = "${var.name}-${each.key}-scale-in"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.worker[each.key].service_namespace
  resource_id        = aws_appautoscaling_target.worker[each.key].resource_id
  scalable_dimension = aws_appautoscaling_target.worker[each.key].scalable_dimension

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = 120
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_upper_bound = 0
      scaling_adjustment          = -1
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "backlog_high" {
  for_each = var.worker_groups

  alarm_name          = "${var.name}-${each.key}-backlog-high"
  alarm_description   = "Scale out worker-${each.key}: more than ${each.value.backlog_per_task} queued messages per running task."
  evaluation_periods  = 1
  threshold           = each.value.backlog_per_task
  comparison_operator = "GreaterThanOrEqualToThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_appautoscaling_policy.scale_out[each.key].arn]

  metric_query {
    id          = "load"
    expression  = local.scaling_queries[each.key].load
    label       = "Queued messages per running task"
    return_data = true
  }

  dynamic "metric_query" {
    for_each = local.scaling_queries[each.key].queue_ids

    content {
      id = metric_query.value.id

      metric {
        namespace   = "toolrail"
        metric_name = "QueueDepth"
        dimensions  = { Environment = var.environment, Queue = metric_query.value.queue }
        stat        = "Maximum"
        period      = 60
      }
    }
  }

  metric_query {
    id = "running"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "RunningTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.this.name, ServiceName = aws_ecs_service.worker[each.key].name }
      stat        = "Average"
      period      = 60
    }
  }

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "backlog_low" {
  for_each = var.worker_groups

  alarm_name          = "${var.name}-${each.key}-backlog-low"
  alarm_description   = "Scale in worker-${each.key}: under ${each.value.backlog_per_task / 4} queued messages per task for ${var.scale_in_idle_minutes} minutes (down to ${each.value.min_capacity})."
  evaluation_periods  = var.scale_in_idle_minutes
  datapoints_to_alarm = var.scale_in_idle_minutes
  threshold           = each.value.backlog_per_task / 4
  comparison_operator = "LessThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_appautoscaling_policy.scale_in[each.key].arn]

  metric_query {
    id          = "load"
    expression  = local.scaling_queries[each.key].load
    label       = "Queued messages per running task"
    return_data = true
  }

  dynamic "metric_query" {
    for_each = local.scaling_queries[each.key].queue_ids

    content {
      id = metric_query.value.id

      metric {
        namespace   = "toolrail"
        metric_name = "QueueDepth"
        dimensions  = { Environment = var.environment, Queue = metric_query.value.queue }
        stat        = "Maximum"
        period      = 60
      }
    }
  }

  metric_query {
    id = "running"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "RunningTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.this.name, ServiceName = aws_ecs_service.worker[each.key].name }
      stat        = "Average"
      period      = 60
    }
  }

  tags = var.tags
}

# --- Queue metric publisher: LLEN per queue -> CloudWatch namespace "toolrail", once a minute. ---
#
# Celery's Redis transport keeps each queue as a list named after it (LPUSH in, BRPOP out), so
# LLEN is the backlog and the list's tail is the oldest message. The function has no third-party
# dependency: it speaks RESP over TLS with the standard library and uses the runtime's boto3.

data "archive_file" "queue_metrics" {
  type        = "zip"
  source_file = "${path.module}/queue_metrics/queue_metrics.py"
  output_path = "${path.module}/build/queue_metrics.zip"
}

data "aws_iam_policy_document" "lambda_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "queue_metrics" {
  name_prefix        = "${var.name}-queue-metrics-"
  description        = "toolrail queue metric publisher: read the Redis token, put toolrail metrics"
  assume_role_policy = data.aws_iam_policy_document.lambda_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "queue_metrics_vpc" {
  role       = aws_iam_role.queue_metrics.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
}

data "aws_iam_policy_document" "queue_metrics" {
  statement {
    sid       = "ReadRedisToken"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.redis_auth_secret_arn]
  }

  statement {
    sid       = "DecryptRedisTokenAndEnvironment"
    actions   = ["kms:Decrypt"]
    resources = [var.redis_kms_key_arn]
  }

  statement {
    sid       = "PutToolrailMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]

    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["toolrail"]
    }
  }

  statement {
    sid       = "WriteOwnLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${var.log_group_arns["queue-metrics"]}:*"]
  }

  statement {
    sid       = "XRayTraces"
    actions   = ["xray:PutTraceSegments", "xray:PutTelemetryRecords"]
    resources = ["*"]
  }
}

resource "aws_iam_role_policy" "queue_metrics" {
  name   = "queue-metrics"
  role   = aws_iam_role.queue_metrics.id
  policy = data.aws_iam_policy_document.queue_metrics.json
}

resource "aws_security_group" "queue_metrics" {
  name_prefix = "${var.name}-queue-metrics-"
  description = "toolrail queue metric publisher: egress only"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-queue-metrics" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "queue_metrics_endpoints" {
  security_group_id = aws_security_group.queue_metrics.id
  description       = "HTTPS to the Secrets Manager and CloudWatch VPC endpoints"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = var.vpc_cidr_block
}

resource "aws_lambda_function" "queue_metrics" {
  #checkov:skip=CKV_AWS_116:A scheduled, idempotent publisher: the next run a minute later supersedes a failed one, and queue-age alarms treat missing data as breaching.
  #checkov:skip=CKV_AWS_272:The code is zipped from this repository at plan time; code signing needs an AWS Signer profile and a signed artifact pipeline this stack does not have.
  function_name                  = "${var.name}-queue-metrics"
  description                    = "Publish LLEN and oldest-message age of toolrail Celery queues to CloudWatch"
  role                           = aws_iam_role.queue_metrics.arn
  runtime                        = "python3.12"
  handler                        = "queue_metrics.handler"
  filename                       = data.archive_file.queue_metrics.output_path
  source_code_hash               = data.archive_file.queue_metrics.output_base64sha256
  timeout                        = 30
  memory_size                    = 128
  reserved_concurrent_executions = 1
  kms_key_arn                    = var.redis_kms_key_arn

  environment {
    variables = {
      QUEUES           = jsonencode(local.measured_queues)
      REDIS_HOST       = var.redis_host
      REDIS_PORT       = tostring(var.redis_port)
      REDIS_SECRET_ARN = var.redis_auth_secret_arn
      METRIC_NAMESPACE = "toolrail"
      ENVIRONMENT      = var.environment
    }
  }

  vpc_config {
    subnet_ids         = var.subnet_ids
    security_group_ids = [aws_security_group.queue_metrics.id, var.redis_client_security_group_id]
  }

  tracing_config {
    mode = "Active"
  }

  logging_config {
    log_format = "JSON"
    log_group  = var.log_group_names["queue-metrics"]
  }

  tags = var.tags

  depends_on = [aws_iam_role_policy.queue_metrics, aws_iam_role_policy_attachment.queue_metrics_vpc]
}

resource "aws_cloudwatch_event_rule" "queue_metrics" {
  name                = "${var.name}-queue-metrics"
  description         = "Run the toolrail queue metric publisher every minute"
  schedule_expression = "rate(1 minute)"

  tags = var.tags
}

resource "aws_cloudwatch_event_target" "queue_metrics" {
  rule = aws_cloudwatch_event_rule.queue_metrics.name
  arn  = aws_lambda_function.queue_metrics.arn
}

resource "aws_lambda_permission" "queue_metrics" {
  statement_id  = "AllowEventBridgeSchedule"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.queue_metrics.function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.queue_metrics.arn
}
