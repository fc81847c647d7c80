output "cluster_name" {
  description = "Name of the ECS cluster running the workers (and the API)."
  value       = aws_ecs_cluster.this.name
}

output "cluster_arn" {
  description = "ARN of the ECS cluster."
  value       = aws_ecs_cluster.this.arn
}

output "service_names" {
  description = "ECS service name per worker group."
  value       = { for group, service in aws_ecs_service.worker : group => service.name }
}

output "task_role_arns" {
  description = "Task role ARN per worker group (grant tool permissions here, nowhere else)."
  value       = { for group, role in aws_iam_role.task : group => role.arn }
}

output "security_group_ids" {
  description = "Security group per worker group."
  value       = { for group, sg in aws_security_group.worker : group => sg.id }
}

output "measured_queues" {
  description = "Queues whose depth and age the metric publisher reports."
  value       = local.measured_queues
}

output "queue_metrics_function_name" {
  description = "Name of the queue metric publisher Lambda function."
  value       = aws_lambda_function.queue_metrics.function_name
}
