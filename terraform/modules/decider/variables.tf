variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. toolrail-dev."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,24}$", var.name))
    error_message = "name must be 3-25 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "environment" {
  type        = string
  description = "Environment name; the Environment dimension of the queue metrics."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the GPU nodes."
}

variable "vpc_cidr_block" {
  type        = string
  description = "VPC CIDR; instances and tasks reach the interface VPC endpoints on 443 inside it."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private GPU subnets for the instances, the Triton tasks and the internal load balancer."

  validation {
    condition     = length(var.subnet_ids) >= 1
    error_message = "subnet_ids needs at least one subnet."
  }
}

variable "s3_prefix_list_id" {
  type        = string
  description = "Prefix list of the S3 gateway endpoint (engine artifacts, ECR image layers)."
}

variable "triton_image" {
  type        = string
  description = "Triton + TensorRT-LLM image built from docker/Dockerfile.triton, pinned by tag or digest."

  validation {
    condition     = !endswith(var.triton_image, ":latest")
    error_message = "Pin the Triton image by version tag or digest, not :latest."
  }
}

variable "triton_trtllm_version" {
  type        = string
  description = "TensorRT-LLM version inside triton_image (docker/Dockerfile.triton ARG TRTLLM_VERSION); the engine must be built with the same."
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
  description = "The build to serve: the deploy block of the manifest `toolrail engine publish` uploads (`--tfvars` writes it as engine.auto.tfvars.json). backend picks the Triton model; task_memory_mib is the Triton task's memory as sized from the published weights and processes (engine_build/sizing.py); hub_egress opens HTTPS to the internet for a model the server downloads. Artifacts live under s3://<artifacts bucket>/engines/<build_key>/."

  validation {
    condition     = can(regex("^[0-9a-f]{16,64}$", var.engine.build_key))
    error_message = "engine.build_key must be the hex build key from manifest.json."
  }

  validation {
    condition     = var.engine.task_memory_mib >= 1024
    error_message = "engine.task_memory_mib comes from the publish manifest (toolrail engine publish --tfvars); it is at least 1024."
  }

  validation {
    condition     = contains(["pytorch", "engine"], var.engine.backend)
    error_message = "engine.backend must be pytorch (LLM-API model llmapi) or engine (trtllm-build, model tensorrt_llm_bls), as in manifest.json."
  }
}

variable "gpu_catalog" {
  type = map(object({
    instance_type = string
    sm            = number
    gpus          = number
    memory_mib    = number
  }))
  description = "GPU name (as engine_build names it) -> the EC2 instance type that carries it, its SM, GPUs and memory (MiB) per instance; engine_build/sizing.py INSTANCES holds the same table."
  default = {
    t4   = { instance_type = "g4dn.xlarge", sm = 75, gpus = 1, memory_mib = 16384 }
    a10g = { instance_type = "g5.xlarge", sm = 86, gpus = 1, memory_mib = 16384 }
    l4   = { instance_type = "g6.xlarge", sm = 89, gpus = 1, memory_mib = 16384 }
    l40s = { instance_type = "g6e.xlarge", sm = 89, gpus = 1, memory_mib = 32768 }
    a100 = { instance_type = "p4d.24xlarge", sm = 80, gpus = 8, memory_mib = 1179648 }
    h100 = { instance_type = "p5.48xlarge", sm = 90, gpus = 8, memory_mib = 2097152 }
    h200 = { instance_type = "p5e.48xlarge", sm = 90, gpus = 8, memory_mib = 2097152 }
  }
}

variable "ecs_reserved_memory_mib" {
  type        = number
  description = "Memory the ECS agent and the OS keep on each GPU instance; a task gets its GPUs' share of the rest (engine_build/sizing.py ECS_RESERVED_MIB)."
  default     = 1024
}

variable "instance_type" {
  type        = string
  description = "Override of the catalog instance type; must be the same instance family (same GPU). Empty uses the catalog."
  default     = ""
}

variable "gpus_per_task" {
  type        = number
  description = "GPUs each Triton task reserves (tensor parallel size of the engine)."
  default     = 1

  validation {
    condition     = var.gpus_per_task >= 1 && var.gpus_per_task <= 8
    error_message = "gpus_per_task must be between 1 and 8."
  }
}

variable "task_cpu" {
  type        = number
  description = "CPU units reserved for a Triton task (1024 = one vCPU)."
  default     = 3072
}

variable "min_capacity" {
  type        = number
  description = "Minimum Triton tasks (one per GPU instance). 0 lets an idle environment release its GPUs."
  default     = 1

  validation {
    condition     = var.min_capacity >= 0
    error_message = "min_capacity must be >= 0."
  }
}

variable "max_capacity" {
  type        = number
  description = "Maximum Triton tasks."
  default     = 2

  validation {
    condition     = var.max_capacity >= 1
    error_message = "max_capacity must be >= 1."
  }
}

variable "decide_queue" {
  type        = string
  description = "Celery queue of the decide tasks; its depth drives Triton scaling."
  default     = "decide"
}

variable "scale_out_backlog" {
  type        = number
  description = "Queued decide tasks per running Triton task above which another task (and GPU instance) is added."
  default     = 16
}

variable "scale_in_idle_minutes" {
  type        = number
  description = "Minutes the decide queue must stay empty before one Triton task is removed."
  default     = 15
}

variable "root_volume_gb" {
  type        = number
  description = "Root EBS volume per GPU instance (the Triton image is ~20 GB, plus engines)."
  default     = 200

  validation {
    condition     = var.root_volume_gb >= 100
    error_message = "root_volume_gb must be at least 100 (image plus engine files)."
  }
}

variable "ami_ssm_parameter" {
  type        = string
  description = "SSM parameter holding the ECS GPU-optimized AMI ID (NVIDIA driver and container toolkit preinstalled)."
  default     = "/aws/service/ecs/optimized-ami/amazon-linux-2/gpu/recommended/image_id"
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the internal load balancer from deletion (true in prod)."
  default     = true
}

variable "log_group_name" {
  type        = string
  description = "Log group for the Triton containers (observability module)."
}

variable "lb_logs_bucket" {
  type        = string
  description = "S3 bucket for server access logs of the artifacts bucket (observability module)."
}

variable "alarm_topic_arn" {
  type        = string
  description = "SNS topic for the unhealthy-host alarm."
}

variable "tags" {
  type        = map(string)
  description = "Extra tags for every resource (the provider's default_tags carry the common ones)."
  default     = {}
}
