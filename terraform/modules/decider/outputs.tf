output "triton_grpc_url" {
  description = "host:port of Triton gRPC behind the internal load balancer (TOOLRAIL_TRITON_URL)."
  value       = "${aws_lb.triton.dns_name}:8001"
}

output "triton_model" {
  description = "Model the decide workers call (TOOLRAIL_TRITON_MODEL): llmapi for the pytorch repository flavour, tensorrt_llm_bls for the engine flavour (engine_build/triton_repo.py)."
  value       = var.engine.backend == "engine" ? "tensorrt_llm_bls" : "llmapi"
}

output "client_security_group_id" {
  description = "Security group to attach to tasks that call Triton (decide workers)."
  value       = aws_security_group.client.id
}

output "artifacts_bucket" {
  description = "S3 bucket the engine-build CLI uploads engines/<build_key>/ to."
  value       = aws_s3_bucket.artifacts.id
}

output "artifacts_kms_key_arn" {
  description = "KMS key of the artifacts bucket; the engine-build role needs kms:GenerateDataKey on it to upload."
  value       = aws_kms_key.this.arn
}

output "manifest_uri" {
  description = "S3 URI of the manifest.json the Triton entrypoint reads."
  value       = local.manifest_uri
}

output "instance_type" {
  description = "GPU instance type chosen for the engine's GPU and SM."
  value       = local.instance_type
}

output "cluster_name" {
  description = "ECS cluster of the GPU capacity."
  value       = aws_ecs_cluster.gpu.name
}

output "service_name" {
  description = "ECS service running Triton."
  value       = aws_ecs_service.triton.name
}
