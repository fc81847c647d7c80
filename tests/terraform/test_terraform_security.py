"""Security properties of the stack, asserted on the parsed Terraform."""

from __future__ import annotations

import re

import pytest
from tf_parse import ENV_NAMES, TERRAFORM, expr, hcl_files, plain, unquote

SECRET_PATTERNS = [
    re.compile(r"AKIA[0-9A-Z]{16}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"(?i)aws_secret_access_key|aws_access_key_id"),
    re.compile(r"""(?i)\b(password|auth_token|secret_string|api_key|token)\s*=\s*"[^"$]{4,}"""),
]


def test_no_hard_coded_credentials():
    found = []
    for path in [*hcl_files(), *TERRAFORM.rglob("*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if any(p.search(line) for p in SECRET_PATTERNS):
                found.append(f"{path.relative_to(TERRAFORM)}:{number}: {line.strip()}")
    assert not found, found


def _ingress_rules(stack):
    for module_name, config in stack.modules.items():
        for _, name, body in config.resources("aws_vpc_security_group_ingress_rule"):
            yield module_name, name, plain(body)
        for _, name, body in config.resources("aws_security_group_rule"):
            if unquote(body.get("type")) == "ingress":
                yield module_name, name, plain(body)
        for _, name, body in config.resources("aws_security_group"):
            for rule in plain(body).get("ingress", []):
                yield module_name, name, rule


def test_ingress_only_from_security_groups_or_the_vpc_except_the_load_balancer_on_443(stack):
    rules = list(_ingress_rules(stack))
    assert len(rules) >= 5
    for module_name, name, rule in rules:
        cidr = " ".join(str(rule.get(k, "")) for k in ("cidr_ipv4", "cidr_ipv6", "cidr_blocks", "ipv6_cidr_blocks"))
        assert "0.0.0.0/0" not in cidr and "::/0" not in cidr, f"{module_name}.{name}: literal open ingress"
        if rule.get("referenced_security_group_id") or rule.get("security_groups"):
            continue
        if "cidr_block" in cidr and "vpc" in cidr:
            continue
        # The only rule fed by client CIDRs (0.0.0.0/0 by default) is the public ALB's HTTPS rule.
        assert (module_name, name) == ("api", "alb_https"), f"{module_name}.{name}: ingress from {cidr}"
        assert rule["from_port"] == rule["to_port"] == 443
        assert "var.allowed_ingress_cidrs" in expr(stack.modules["api"].resource("aws_vpc_security_group_ingress_rule", "alb_https")["for_each"])


def test_redis_encrypted_authenticated_and_never_evicting(stack):
    redis = stack.modules["redis"]
    group = plain(redis.resource("aws_elasticache_replication_group", "this"))
    assert group["at_rest_encryption_enabled"] is True
    assert group["transit_encryption_enabled"] is True
    assert group["transit_encryption_mode"] == "required"
    assert "aws_kms_key.this.arn" in group["kms_key_id"]
    assert "random_password.auth.result" in group["auth_token"]
    assert group["automatic_failover_enabled"] == "${local.multi_node}" == group["multi_az_enabled"]
    assert "var.num_cache_clusters > 1" in redis.text()
    parameters = plain(redis.resource("aws_elasticache_parameter_group", "this"))["parameter"]
    assert {"name": "maxmemory-policy", "value": "noeviction"} in parameters
    assert "rediss://" in redis.text() and "ssl_cert_reqs=required" in redis.text()


def test_prod_redis_fails_over_automatically(stack):
    assert stack.tfvars("prod")["redis_num_cache_clusters"] >= 2


def test_ecs_tasks_never_get_public_ips(stack):
    services = [(m, n, plain(b)) for m, c in stack.modules.items() for _, n, b in c.resources("aws_ecs_service")]
    assert {m for m, _, _ in services} == {"api", "executor", "decider"}
    for module_name, name, service in services:
        (network,) = service["network_configuration"]
        assert network["assign_public_ip"] is False, f"{module_name}.{name}"
    for config in stack.modules.values():
        for _, name, task in config.resources("aws_ecs_task_definition"):
            assert unquote(task["network_mode"]) == "awsvpc", name
            assert "readonlyRootFilesystem = true" in expr(task["container_definitions"]).replace("  ", " ") or "readonlyRootFilesystem" in str(task)


def test_tool_workers_scale_to_zero_in_dev(stack):
    executor = stack.modules["executor"]
    target = plain(executor.resource("aws_appautoscaling_target", "worker"))
    assert target["min_capacity"] == "${each.value.min_capacity}"
    groups = stack.tfvars("dev")["worker_groups"]
    tool_groups = {k: g for k, g in groups.items() if any(q.startswith("tool.") for q in g["queues"])}
    assert tool_groups, "dev defines no tool worker groups"
    for name, group in tool_groups.items():
        assert group.get("min_capacity", 0) == 0, f"dev worker group {name} does not scale to zero"
    # Scale-in to zero needs a policy that removes the last task and an alarm that fires when idle.
    scale_in = plain(executor.resource("aws_appautoscaling_policy", "scale_in"))
    (step,) = scale_in["step_scaling_policy_configuration"][0]["step_adjustment"]
    assert step["scaling_adjustment"] == -1
    low = plain(executor.resource("aws_cloudwatch_metric_alarm", "backlog_low"))
    assert "scale_in" in low["alarm_actions"][0]
    # Scale-out from zero: with no running task, the load expression still rises with the backlog.
    assert "IF(FILL(running, 0) < 1" in executor.text()


def test_worker_time_limits_fit_the_stop_timeout(stack):
    text = stack.modules["executor"].text()
    assert "g.task_time_limit_s <= 100" in text
    assert "stop_timeout_s = 120" in text
    assert "TOOLRAIL_TASK_TIME_LIMIT_S" in text


def test_data_at_rest_uses_kms(stack):
    for module_name, config in stack.modules.items():
        for _, name, key in config.resources("aws_kms_key"):
            assert plain(key)["enable_key_rotation"] is True, f"{module_name}.{name}"
        for _, name, group in config.resources("aws_cloudwatch_log_group"):
            assert "kms_key_id" in group, f"{module_name}: log group {name} without KMS"
        for _, name, secret in config.resources("aws_secretsmanager_secret"):
            assert "kms_key_id" in secret, f"{module_name}: secret {name} without KMS"
        for _, name, topic in config.resources("aws_sns_topic"):
            assert "kms_master_key_id" in topic, f"{module_name}: topic {name} without KMS"
        buckets = {n for _, n, _ in config.resources("aws_s3_bucket")}
        encryption = {n: plain(b) for _, n, b in config.resources("aws_s3_bucket_server_side_encryption_configuration")}
        assert buckets == set(encryption), f"{module_name}: buckets without encryption config"
        for name, conf in encryption.items():
            algorithm = conf["rule"][0]["apply_server_side_encryption_by_default"][0]["sse_algorithm"]
            if name == "lb_logs":  # ELB log delivery supports SSE-S3 only; see the checkov skip
                assert algorithm == "AES256"
            else:
                assert algorithm == "aws:kms", f"{module_name}.{name}"
    decider = stack.modules["decider"]
    ebs = plain(decider.resource("aws_launch_template", "gpu"))["block_device_mappings"][0]["ebs"][0]
    assert ebs["encrypted"] is True and "kms_key_id" in ebs
    assert "kms_key_arn" in stack.modules["executor"].resource("aws_lambda_function", "queue_metrics")


def test_api_is_https_only_with_a_pinned_tls_policy(stack):
    api = stack.modules["api"]
    listeners = [plain(b) for _, _, b in api.resources("aws_lb_listener")]
    assert len(listeners) == 1
    (listener,) = listeners
    assert listener["protocol"] == "HTTPS" and listener["port"] == 443
    assert listener["ssl_policy"] == "${var.ssl_policy}"
    assert unquote(api.variables["ssl_policy"]["default"]).startswith("ELBSecurityPolicy-TLS13-")
    alb = plain(api.resource("aws_lb", "api"))
    assert alb["drop_invalid_header_fields"] is True
    assert "TOOLRAIL_API_KEYS" in api.text() and "aws_secretsmanager_secret.api_keys.arn" in api.text()


def test_triton_health_checks_the_ready_endpoint(stack):
    target_group = plain(stack.modules["decider"].resource("aws_lb_target_group", "triton"))
    (check,) = target_group["health_check"]
    assert check["path"] == "/v2/health/ready" and str(check["port"]) == "8000"
    assert target_group["port"] == 8001


@pytest.mark.parametrize("env", ENV_NAMES)
def test_prod_protects_and_dev_can_be_destroyed(stack, env):
    values = stack.tfvars(env)
    assert values["deletion_protection"] is (env == "prod")


def test_every_checkov_skip_has_a_reason():
    skips = []
    for path in hcl_files():
        for line in path.read_text().splitlines():
            if "checkov:skip=" in line:
                check, _, reason = line.split("checkov:skip=", 1)[1].partition(":")
                skips.append((check, reason.strip()))
                assert re.fullmatch(r"CKV2?_AWS_\d+", check), line
                assert len(reason.strip()) >= 40, f"{check}: reason too thin: {reason!r}"
    assert skips


def test_the_zone_data_source_is_pinned_by_zone_name_not_skipped(stack):
    """CKV_AWS_394 (checkov >= 3.3): a zone AWS adds later must not join the VPC or shift its subnets."""
    network = stack.modules["network"]
    (zones,) = [plain(body) for block in network.blocks("data") for kind, named in block.items()
                if unquote(kind) == "aws_availability_zones" for body in named.values()]
    (pin,) = zones["filter"]
    assert pin["name"] == "zone-name" and expr(pin["values"]) == "local.zone_names"
    assert not any("skip=CKV_AWS_394" in path.read_text() for path in hcl_files())
    assert re.search(r'CHECKOV_VERSION="\$\{CHECKOV_VERSION:-3\.3\.30\}"', (TERRAFORM.parent / "scripts" / "checkov.sh").read_text())
