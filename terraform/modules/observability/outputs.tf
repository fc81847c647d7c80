output "kms_key_arn" {
  description = "KMS key for log groups and the alarm topic; other modules encrypt their log groups with it."
  value       = aws_kms_key.this.arn
}

output "log_group_names" {
  description = "Log group name per service."
  value       = { for service, group in aws_cloudwatch_log_group.service : service => group.name }
}

output "log_group_arns" {
  description = "Log group ARN per service, for least-privilege write permissions."
  value       = { for service, group in aws_cloudwatch_log_group.service : service => group.arn }
}

output "waf_log_group_arn" {
  description = "Log group for WAF request logs (name starts with aws-waf-logs-)."
  value       = aws_cloudwatch_log_group.waf.arn
}

output "alarm_topic_arn" {
  description = "SNS topic every alarm notifies."
  value       = aws_sns_topic.alarms.arn
}

output "lb_logs_bucket" {
  description = "S3 bucket receiving ALB and NLB access logs."
  value       = aws_s3_bucket.lb_logs.id
}

output "request_id_query_name" {
  description = "Saved CloudWatch Logs Insights query that follows one request_id across services."
  value       = aws_cloudwatch_query_definition.by_request_id.name
}

output "log_metric_namespace" {
  description = "Namespace of the log-derived metrics (ErrorLogLines, NeedsReviewJobs)."
  value       = local.log_namespace
}

output "prometheus_workspace_arn" {
  description = "Amazon Managed Service for Prometheus workspace holding the API's /metrics (grant aps:RemoteWrite on it to the collector)."
  value       = aws_prometheus_workspace.this.arn
}

output "prometheus_query_url" {
  description = "Prometheus-compatible query endpoint of the workspace: the Grafana data source of the toolrail dashboard."
  value       = aws_prometheus_workspace.this.prometheus_endpoint
}

output "grafana_dashboard_json" {
  description = "The toolrail Grafana dashboard (dashboards/toolrail.json; its data source is the variable datasource)."
  value       = local.dashboard_json
}

output "metrics_collector_config" {
  description = "OpenTelemetry collector config (YAML) for a sidecar: scrape the API's /metrics and remote-write to the workspace."
  value       = local.metrics_collector_config
}
