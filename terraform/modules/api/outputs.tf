output "alb_dns_name" {
  description = "DNS name of the API load balancer; point the API's DNS record (the certificate's name) at it."
  value       = aws_lb.api.dns_name
}

output "alb_zone_id" {
  description = "Hosted zone of the load balancer, for a Route 53 alias record."
  value       = aws_lb.api.zone_id
}

output "alb_arn_suffix" {
  description = "ARN suffix of the load balancer, for CloudWatch metrics."
  value       = aws_lb.api.arn_suffix
}

output "target_group_arn_suffix" {
  description = "ARN suffix of the API target group, for CloudWatch metrics."
  value       = aws_lb_target_group.api.arn_suffix
}

output "api_keys_secret_arn" {
  description = "Secrets Manager secret to fill with TOOLRAIL_API_KEYS (key:tenant,...) after the first apply."
  value       = aws_secretsmanager_secret.api_keys.arn
}

output "service_name" {
  description = "ECS service running the API."
  value       = aws_ecs_service.api.name
}

output "security_group_id" {
  description = "Security group of the API tasks."
  value       = aws_security_group.task.id
}

output "web_acl_arn" {
  description = "WAF web ACL protecting the load balancer, or null when WAF is off."
  value       = try(aws_wafv2_web_acl.api[0].arn, null)
}
