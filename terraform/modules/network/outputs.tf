output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr_block" {
  description = "IPv4 CIDR of the VPC; security groups use it for traffic to the VPC endpoints."
  value       = aws_vpc.this.cidr_block
}

output "public_subnet_ids" {
  description = "Public subnets, for the internet-facing load balancer only."
  value       = aws_subnet.public[*].id
}

output "private_subnet_ids" {
  description = "Private subnets for the API, the Celery workers, Redis and the metric publisher."
  value       = aws_subnet.private[*].id
}

output "gpu_subnet_ids" {
  description = "Private subnets for the Triton GPU instances."
  value       = aws_subnet.gpu[*].id
}

output "private_route_table_ids" {
  description = "Route tables of the private and GPU subnets."
  value       = aws_route_table.private[*].id
}

output "s3_prefix_list_id" {
  description = "Prefix list of the S3 gateway endpoint, for security group egress to S3 (ECR layers, engine artifacts)."
  value       = aws_vpc_endpoint.s3.prefix_list_id
}

output "endpoint_security_group_id" {
  description = "Security group of the interface VPC endpoints."
  value       = aws_security_group.endpoints.id
}

output "nat_gateway_count" {
  description = "Number of NAT gateways (0 when tools get no internet egress)."
  value       = local.nat_count
}
