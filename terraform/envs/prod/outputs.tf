output "api_url" {
  description = "HTTPS endpoint of the job API (point the certificate's DNS name at alb_dns_name)."
  value       = "https://${module.api.alb_dns_name}"
}

output "alb_dns_name" {
  description = "DNS name of the API load balancer."
  value       = module.api.alb_dns_name
}

output "api_keys_secret_arn" {
  description = "Secret to fill with TOOLRAIL_API_KEYS after the first apply."
  value       = module.api.api_keys_secret_arn
}

output "triton_grpc_url" {
  description = "Internal Triton gRPC endpoint used by the decide workers."
  value       = module.decider.triton_grpc_url
}

output "engine_artifacts_bucket" {
  description = "Bucket `toolrail engine publish` uploads engines/<build_key>/ to."
  value       = module.decider.artifacts_bucket
}

output "engine_manifest_uri" {
  description = "manifest.json the Triton tasks load."
  value       = module.decider.manifest_uri
}

output "gpu_instance_type" {
  description = "GPU instance type matching the engine's SM."
  value       = module.decider.instance_type
}

output "ecs_cluster_name" {
  description = "ECS cluster of the API and the workers."
  value       = module.executor.cluster_name
}

output "worker_services" {
  description = "ECS service per worker group."
  value       = module.executor.service_names
}

output "redis_auth_secret_arn" {
  description = "Secret holding the Redis token and URL (ARN only)."
  value       = module.redis.auth_secret_arn
}

output "alarm_topic_arn" {
  description = "SNS topic of all alarms."
  value       = module.observability.alarm_topic_arn
}

output "request_id_query" {
  description = "Saved Logs Insights query that follows one request_id across services."
  value       = module.observability.request_id_query_name
}
