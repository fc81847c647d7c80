output "replication_group_id" {
  description = "ID of the ElastiCache replication group."
  value       = aws_elasticache_replication_group.this.id
}

output "primary_endpoint_address" {
  description = "Primary endpoint host name (TLS on port 6379)."
  value       = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "reader_endpoint_address" {
  description = "Reader endpoint host name."
  value       = aws_elasticache_replication_group.this.reader_endpoint_address
}

output "port" {
  description = "Redis port."
  value       = 6379
}

output "auth_secret_arn" {
  description = "Secrets Manager secret holding JSON {auth_token, url}; the value itself is never an output."
  value       = aws_secretsmanager_secret.auth.arn
}

output "url_secret_value_from" {
  description = "ECS valueFrom that injects the rediss:// URL (with token) as REDIS_URL."
  value       = "${aws_secretsmanager_secret.auth.arn}:url::"
}

output "kms_key_arn" {
  description = "KMS key of the cache and its secret; task execution roles need kms:Decrypt on it."
  value       = aws_kms_key.this.arn
}

output "security_group_id" {
  description = "Security group of the cache nodes."
  value       = aws_security_group.redis.id
}

output "client_security_group_id" {
  description = "Security group to attach to every task that talks to Redis."
  value       = aws_security_group.client.id
}
