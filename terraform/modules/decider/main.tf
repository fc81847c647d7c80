data "aws_region" "current" {}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

data "aws_ssm_parameter" "ami" {
  name = var.ami_ssm_parameter
}

locals {
  region     = data.aws_region.current.name
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  gpu           = lower(var.engine.gpu)
  gpu_entry     = lookup(var.gpu_catalog, local.gpu, null)
  instance_type = var.instance_type != "" ? var.instance_type : try(local.gpu_entry.instance_type, "")
  engine_prefix = "engines/${var.engine.build_key}"
  # The task's share of its instance's memory, as engine_build/sizing.py host_share_mib computes it.
  task_memory_share = floor((try(local.gpu_entry.memory_mib, 0) - var.ecs_reserved_memory_mib) * var.gpus_per_task / try(local.gpu_entry.gpus, 1))
  manifest_uri      = "s3://${aws_s3_bucket.artifacts.id}/${local.engine_prefix}/manifest.json"
}

# --- KMS: engine artifacts and the GPU instances' EBS volumes ---

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

  # The Auto Scaling service-linked role launches instances with volumes encrypted by this key.
  statement {
    sid = "AutoScalingUsesKeyForVolumes"
    actions = [
      "kms:Encrypt",
      "kms:Decrypt",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:DescribeKey",
    ]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"]
    }
  }

  statement {
    sid       = "AutoScalingCreatesGrants"
    actions   = ["kms:CreateGrant"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${local.partition}:iam::${local.account_id}:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"]
    }

    condition {
      test     = "Bool"
      variable = "kms:GrantIsForAWSResource"
      values   = ["true"]
    }
  }
}

resource "aws_kms_key" "this" {
  description             = "${var.name}: engine artifacts and GPU instance volumes"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json

  tags = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-decider"
  target_key_id = aws_kms_key.this.key_id
}

# --- Engine artifacts: `toolrail engine publish` uploads engines/<build_key>/, manifest.json last. ---

resource "aws_s3_bucket" "artifacts" {
  #checkov:skip=CKV_AWS_144:Engines are reproducible from their build key (model, SM, TensorRT-LLM version, options); replication would be cost without recovery value.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to uploads; a deploy names the build key explicitly.
  bucket_prefix = "${var.name}-engines-"

  tags = var.tags
}

resource "aws_s3_bucket_public_access_block" "artifacts" {
  bucket                  = aws_s3_bucket.artifacts.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  rule {
    bucket_key_enabled = true

    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.this.arn
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  rule {
    id     = "expire-replaced-engine-files"
    status = "Enabled"

    filter {}

    noncurrent_version_expiration {
      noncurrent_days = 30
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }
}

resource "aws_s3_bucket_logging" "artifacts" {
  bucket        = aws_s3_bucket.artifacts.id
  target_bucket = var.lb_logs_bucket
  target_prefix = "s3-access/${var.name}-engines/"
}

data "aws_iam_policy_document" "artifacts" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.artifacts.arn, "${aws_s3_bucket.artifacts.arn}/*"]

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

resource "aws_s3_bucket_policy" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id
  policy = data.aws_iam_policy_document.artifacts.json

  depends_on = [aws_s3_bucket_public_access_block.artifacts]
}

# --- Security groups ---
#
# clients (decide workers) -> load balancer :8001 -> Triton tasks :8001 (gRPC), :8000 (health)

resource "aws_security_group" "client" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module, by the executor module, to the decide workers that call Triton.
  name_prefix = "${var.name}-triton-client-"
  description = "Attach to tasks that call Triton gRPC"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-triton-client" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-triton-lb-"
  description = "Internal load balancer in front of Triton gRPC"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-triton-lb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "task" {
  name_prefix = "${var.name}-triton-"
  description = "Triton tasks: gRPC and health from the load balancer; HTTPS to VPC endpoints and S3"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-triton" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "instance" {
  name_prefix = "${var.name}-gpu-node-"
  description = "GPU container instances: no ingress; HTTPS to VPC endpoints and S3 for the ECS agent and image pulls"
  vpc_id      = var.vpc_id

  tags = merge(var.tags, { Name = "${var.name}-gpu-node" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "client_to_lb" {
  security_group_id            = aws_security_group.client.id
  description                  = "Triton gRPC through the internal load balancer"
  ip_protocol                  = "tcp"
  from_port                    = 8001
  to_port                      = 8001
  referenced_security_group_id = aws_security_group.lb.id
}

resource "aws_vpc_security_group_ingress_rule" "lb_from_clients" {
  security_group_id            = aws_security_group.lb.id
  description                  = "Triton gRPC from decide workers"
  ip_protocol                  = "tcp"
  from_port                    = 8001
  to_port                      = 8001
  referenced_security_group_id = aws_security_group.client.id
}

resource "aws_vpc_security_group_egress_rule" "lb_to_tasks" {
  for_each = toset(["8000", "8001"])

  security_group_id            = aws_security_group.lb.id
  description                  = "Triton port ${each.key} (8001 gRPC, 8000 ready checks)"
  ip_protocol                  = "tcp"
  from_port                    = tonumber(each.key)
  to_port                      = tonumber(each.key)
  referenced_security_group_id = aws_security_group.task.id
}

resource "aws_vpc_security_group_ingress_rule" "tasks_from_lb" {
  for_each = toset(["8000", "8001"])

  security_group_id            = aws_security_group.task.id
  description                  = "Triton port ${each.key} from the load balancer"
  ip_protocol                  = "tcp"
  from_port                    = tonumber(each.key)
  to_port                      = tonumber(each.key)
  referenced_security_group_id = aws_security_group.lb.id
}

resource "aws_vpc_security_group_egress_rule" "https_endpoints" {
  for_each = { task = aws_security_group.task.id, instance = aws_security_group.instance.id }

  security_group_id = each.value
  description       = "HTTPS to the interface VPC endpoints"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = var.vpc_cidr_block
}

# Only for a model the LLM API downloads itself (publish --hub-egress): HTTPS out through the NAT.
resource "aws_vpc_security_group_egress_rule" "https_hub" {
  count = var.engine.hub_egress ? 1 : 0

  security_group_id = aws_security_group.task.id
  description       = "HTTPS to a model hub (engine.hub_egress)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_egress_rule" "https_s3" {
  for_each = { task = aws_security_group.task.id, instance = aws_security_group.instance.id }

  security_group_id = each.value
  description       = "HTTPS to S3 through the gateway endpoint (engines, image layers)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.s3_prefix_list_id
}

# --- GPU capacity: an Auto Scaling group of ECS GPU-optimized instances behind a capacity provider ---

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "instance" {
  name_prefix        = "${var.name}-gpu-node-"
  description        = "ECS container agent on the Triton GPU instances"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "instance" {
  role       = aws_iam_role.instance.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
}

resource "aws_iam_instance_profile" "instance" {
  name_prefix = "${var.name}-gpu-node-"
  role        = aws_iam_role.instance.name

  tags = var.tags
}

resource "aws_ecs_cluster" "gpu" {
  name = "${var.name}-gpu"

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  tags = var.tags
}

resource "aws_launch_template" "gpu" {
  name_prefix   = "${var.name}-gpu-"
  description   = "ECS GPU node for Triton (${local.gpu}, sm${var.engine.sm})"
  image_id      = data.aws_ssm_parameter.ami.value
  instance_type = local.instance_type
  ebs_optimized = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.instance.arn
  }

  # IMDSv2 only, one hop: containers cannot borrow the instance role.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  network_interfaces {
    associate_public_ip_address = false
    security_groups             = [aws_security_group.instance.id]
  }

  block_device_mappings {
    device_name = "/dev/xvda"

    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = aws_kms_key.this.arn
      delete_on_termination = true
    }
  }

  user_data = base64encode(join("\n", [
    "#!/bin/bash",
    "cat >> /etc/ecs/ecs.config <<'ECS'",
    "ECS_CLUSTER=${aws_ecs_cluster.gpu.name}",
    "ECS_ENABLE_GPU_SUPPORT=true",
    "ECS_AWSVPC_BLOCK_IMDS=true",
    "ECS_ENABLE_CONTAINER_METADATA=true",
    "ECS_IMAGE_PULL_BEHAVIOR=prefer-cached",
    "ECS",
  ]))

  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = "${var.name}-gpu-node" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(var.tags, { Name = "${var.name}-gpu-node" })
  }

  tags = var.tags

  lifecycle {
    precondition {
      condition     = local.gpu_entry != null
      error_message = "engine.gpu '${var.engine.gpu}' is not in gpu_catalog; add the instance type that carries it."
    }

    precondition {
      condition     = try(local.gpu_entry.sm, -1) == var.engine.sm
      error_message = "The engine was built for sm${var.engine.sm} but gpu_catalog maps '${local.gpu}' to sm${try(local.gpu_entry.sm, -1)}: a TensorRT engine runs only on the SM it was built for."
    }

    precondition {
      condition     = split(".", local.instance_type)[0] == split(".", try(local.gpu_entry.instance_type, ""))[0]
      error_message = "instance_type ${local.instance_type} is not in the ${try(local.gpu_entry.instance_type, "?")} family, which carries the engine's GPU."
    }

    precondition {
      condition     = var.engine.trtllm_version == var.triton_trtllm_version
      error_message = "The engine was built with TensorRT-LLM ${var.engine.trtllm_version}, the Triton image carries ${var.triton_trtllm_version}; engines are not portable across versions."
    }

    precondition {
      condition     = var.gpus_per_task <= try(local.gpu_entry.gpus, 0)
      error_message = "gpus_per_task exceeds the GPUs of one ${local.instance_type}."
    }
  }
}

resource "aws_autoscaling_group" "gpu" {
  name_prefix           = "${var.name}-gpu-"
  vpc_zone_identifier   = var.subnet_ids
  min_size              = var.min_capacity
  max_size              = var.max_capacity
  protect_from_scale_in = true
  health_check_type     = "EC2"

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  # The ECS capacity provider manages the desired size.
  lifecycle {
    ignore_changes = [desired_capacity]
  }

  tag {
    key                 = "AmazonECSManaged"
    value               = "true"
    propagate_at_launch = true
  }

  dynamic "tag" {
    for_each = var.tags

    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }
}

resource "aws_ecs_capacity_provider" "gpu" {
  name = "${var.name}-gpu"

  auto_scaling_group_provider {
    auto_scaling_group_arn         = aws_autoscaling_group.gpu.arn
    managed_termination_protection = "ENABLED"
    managed_draining               = "ENABLED"

    managed_scaling {
      status                    = "ENABLED"
      target_capacity           = 100
      minimum_scaling_step_size = 1
      maximum_scaling_step_size = 2
    }
  }

  tags = var.tags
}

resource "aws_ecs_cluster_capacity_providers" "gpu" {
  cluster_name       = aws_ecs_cluster.gpu.name
  capacity_providers = [aws_ecs_capacity_provider.gpu.name]

  default_capacity_provider_strategy {
    capacity_provider = aws_ecs_capacity_provider.gpu.name
    weight            = 1
  }
}

# --- Triton task: the entrypoint fetches engines/<build_key>/ by its manifest, checks sha256,
#     SM and TensorRT-LLM version, then starts tritonserver. ---

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
  name_prefix        = "${var.name}-triton-exec-"
  description        = "ECS agent for Triton: pull the image, write logs"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

resource "aws_iam_role" "task" {
  name_prefix        = "${var.name}-triton-"
  description        = "Triton task: read its engine from the artifacts bucket"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = var.tags
}

data "aws_iam_policy_document" "task" {
  statement {
    sid       = "ReadEngine"
    actions   = ["s3:GetObject"]
    resources = ["${aws_s3_bucket.artifacts.arn}/${local.engine_prefix}/*"]
  }

  statement {
    sid       = "ListEngine"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.artifacts.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.engine_prefix}/*"]
    }
  }

  statement {
    sid       = "DecryptEngine"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.this.arn]
  }
}

resource "aws_iam_role_policy" "task" {
  name   = "read-engine"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json
}

resource "aws_ecs_task_definition" "triton" {
  family                   = "${var.name}-triton"
  requires_compatibilities = ["EC2"]
  network_mode             = "awsvpc"
  cpu                      = var.task_cpu
  memory                   = var.engine.task_memory_mib
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  volume {
    name = "engines"
  }

  volume {
    name = "scratch"
  }

  container_definitions = jsonencode([{
    name                   = "triton"
    image                  = var.triton_image
    essential              = true
    readonlyRootFilesystem = true
    stopTimeout            = 120
    resourceRequirements   = [{ type = "GPU", value = tostring(var.gpus_per_task) }]
    linuxParameters        = { initProcessEnabled = true, sharedMemorySize = 2048 }
    ulimits                = [{ name = "memlock", softLimit = -1, hardLimit = -1 }, { name = "stack", softLimit = 67108864, hardLimit = 67108864 }]
    mountPoints = [
      { sourceVolume = "engines", containerPath = "/engines", readOnly = false },
      { sourceVolume = "scratch", containerPath = "/tmp", readOnly = false },
    ]
    portMappings = [
      { containerPort = 8000, protocol = "tcp", name = "http" },
      { containerPort = 8001, protocol = "tcp", name = "grpc" },
      { containerPort = 8002, protocol = "tcp", name = "metrics" },
    ]
    environment = [
      { name = "TOOLRAIL_ENGINE_MANIFEST_URI", value = local.manifest_uri },
      { name = "TOOLRAIL_ENGINE_DIR", value = "/engines" },
      { name = "TOOLRAIL_EXPECTED_TRTLLM_VERSION", value = var.triton_trtllm_version },
      { name = "TOOLRAIL_HUB_EGRESS", value = tostring(var.engine.hub_egress) },
      # Instance metadata is blocked: the S3 client takes its region from here (an S3 gateway
      # endpoint's prefix list covers only this region's S3).
      { name = "AWS_REGION", value = local.region },
      { name = "AWS_DEFAULT_REGION", value = local.region },
      { name = "HOME", value = "/tmp" },
    ]
    healthCheck = {
      command     = ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=3)"]
      interval    = 15
      timeout     = 5
      retries     = 4
      startPeriod = 300
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = var.log_group_name
        awslogs-region        = local.region
        awslogs-stream-prefix = "triton"
        mode                  = "non-blocking"
        max-buffer-size       = "4m"
      }
    }
  }])

  tags = var.tags

  lifecycle {
    precondition {
      condition     = var.engine.trtllm_version == var.triton_trtllm_version
      error_message = "Engine TensorRT-LLM ${var.engine.trtllm_version} does not match the Triton image's ${var.triton_trtllm_version}."
    }

    precondition {
      condition     = var.engine.task_memory_mib <= local.task_memory_share
      error_message = "The build needs ${var.engine.task_memory_mib} MiB for its Triton task; a ${local.instance_type} task gets ${local.task_memory_share} MiB. Plan for a larger GPU instance (toolrail engine plan refuses what cannot fit)."
    }
  }
}

# --- Internal load balancer: gRPC on 8001, health on Triton's ready endpoint (HTTP 8000). ---

resource "aws_lb" "triton" {
  #checkov:skip=CKV_AWS_91:NLBs write access logs only for TLS listeners; this internal TCP listener carries gRPC inside the VPC and every request is logged by Triton and the decide worker with its request_id.
  name                             = "${var.name}-triton"
  internal                         = true
  load_balancer_type               = "network"
  subnets                          = var.subnet_ids
  security_groups                  = [aws_security_group.lb.id]
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.deletion_protection

  tags = var.tags
}

resource "aws_lb_target_group" "triton" {
  name_prefix          = "trt-"
  port                 = 8001
  protocol             = "TCP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 120

  health_check {
    protocol            = "HTTP"
    port                = "8000"
    path                = "/v2/health/ready"
    matcher             = "200"
    interval            = 15
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }

  tags = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "triton" {
  load_balancer_arn = aws_lb.triton.arn
  port              = 8001
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.triton.arn
  }

  tags = var.tags
}

resource "aws_ecs_service" "triton" {
  name                              = "triton"
  cluster                           = aws_ecs_cluster.gpu.id
  task_definition                   = aws_ecs_task_definition.triton.arn
  desired_count                     = var.min_capacity
  health_check_grace_period_seconds = 900
  enable_execute_command            = false
  propagate_tags                    = "SERVICE"
  wait_for_steady_state             = false
  # One task per GPU instance: let a deploy stop the old task before the new one needs its GPU.
  deployment_minimum_healthy_percent = 50
  deployment_maximum_percent         = 100

  capacity_provider_strategy {
    capacity_provider = aws_ecs_capacity_provider.gpu.name
    weight            = 1
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [aws_security_group.task.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.triton.arn
    container_name   = "triton"
    container_port   = 8001
  }

  placement_constraints {
    type = "distinctInstance"
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  tags = var.tags

  lifecycle {
    ignore_changes = [desired_count]
  }

  depends_on = [aws_ecs_cluster_capacity_providers.gpu, aws_lb_listener.triton]
}

# --- Scaling on the decide backlog (queued decide tasks per running Triton task) ---

resource "aws_appautoscaling_target" "triton" {
  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.gpu.name}/${aws_ecs_service.triton.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.min_capacity
  max_capacity       = var.max_capacity

  tags = var.tags
}

resource "aws_appautoscaling_policy" "scale_out" {
  name               = "${var.name}-triton-scale-out"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.triton.service_namespace
  resource_id        = aws_appautoscaling_target.triton.resource_id
  scalable_dimension = aws_appautoscaling_target.triton.scalable_dimension

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = 300
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_lower_bound = 0
      scaling_adjustment          = 1
    }
  }
}

resource "aws_appautoscaling_policy" "scale_in" {
  name               = "${var.name}-triton-scale-in"
  policy_type        = "StepScaling"
  service_namespace  = aws_appautoscaling_target.triton.service_namespace
  resource_id        = aws_appautoscaling_target.triton.resource_id
  scalable_dimension = aws_appautoscaling_target.triton.scalable_dimension

  step_scaling_policy_configuration {
    adjustment_type         = "ChangeInCapacity"
    cooldown                = 600
    metric_aggregation_type = "Maximum"

    step_adjustment {
      metric_interval_upper_bound = 0
      scaling_adjustment          = -1
    }
  }
}

resource "aws_cloudwatch_metric_alarm" "decide_backlog_high" {
  alarm_name          = "${var.name}-triton-backlog-high"
  alarm_description   = "Scale out Triton: more than ${var.scale_out_backlog} queued decide tasks per running Triton task for 2 minutes."
  evaluation_periods  = 2
  datapoints_to_alarm = 2
  threshold           = var.scale_out_backlog
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_appautoscaling_policy.scale_out.arn]

  metric_query {
    id          = "load"
    expression  = "IF(FILL(running, 0) < 1, FILL(backlog, 0) * ${var.scale_out_backlog + 1}, FILL(backlog, 0) / running)"
    label       = "Queued decide tasks per Triton task"
    return_data = true
  }

  metric_query {
    id = "backlog"

    metric {
      namespace   = "toolrail"
      metric_name = "QueueDepth"
      dimensions  = { Environment = var.environment, Queue = var.decide_queue }
      stat        = "Maximum"
      period      = 60
    }
  }

  metric_query {
    id = "running"

    metric {
      namespace   = "ECS/ContainerInsights"
      metric_name = "RunningTaskCount"
      dimensions  = { ClusterName = aws_ecs_cluster.gpu.name, ServiceName = aws_ecs_service.triton.name }
      stat        = "Average"
      period      = 60
    }
  }

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "decide_idle" {
  alarm_name          = "${var.name}-triton-idle"
  alarm_description   = "Scale in Triton: the decide queue stayed empty for ${var.scale_in_idle_minutes} minutes."
  namespace           = "toolrail"
  metric_name         = "QueueDepth"
  dimensions          = { Environment = var.environment, Queue = var.decide_queue }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = var.scale_in_idle_minutes
  datapoints_to_alarm = var.scale_in_idle_minutes
  threshold           = 1
  comparison_operator = "LessThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_appautoscaling_policy.scale_in.arn]

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "unhealthy" {
  alarm_name          = "${var.name}-triton-unhealthy"
  alarm_description   = "A Triton target fails /v2/health/ready."
  namespace           = "AWS/NetworkELB"
  metric_name         = "UnHealthyHostCount"
  dimensions          = { LoadBalancer = aws_lb.triton.arn_suffix, TargetGroup = aws_lb_target_group.triton.arn_suffix }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 5
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = [var.alarm_topic_arn]
  ok_actions          = [var.alarm_topic_arn]

  tags = var.tags
}
