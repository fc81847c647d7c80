"""The decider's Triton task takes its memory from the publish manifest, its S3 region from the task definition,
and a route to a model hub only when the build declares it."""

from __future__ import annotations

import json
import re

import pytest
from tf_parse import ENV_NAMES, ENVS, MODULES, expr, plain, unquote

from engine_build import sizing
from engine_build.gpus import resolve_gpu
from engine_build.publish import deploy_variables


def _task_definition(stack):
    return stack.modules["decider"].resource("aws_ecs_task_definition", "triton")


def test_task_memory_is_the_manifests_not_a_constant(stack):
    decider = stack.modules["decider"]
    assert expr(_task_definition(stack)["memory"]) == "var.engine.task_memory_mib"
    assert "task_memory" not in decider.variables
    engine_type = expr(decider.variables["engine"]["type"])
    assert "task_memory_mib" in engine_type and "hub_egress" in engine_type
    # The module refuses a task larger than its share of the instance, as the plan computes that share.
    text = decider.text()
    assert "var.engine.task_memory_mib <= local.task_memory_share" in text
    assert re.search(r"task_memory_share\s*=\s*floor\(\(try\(local\.gpu_entry\.memory_mib, 0\) - var\.ecs_reserved_memory_mib\)"
                     r" \* var\.gpus_per_task / try\(local\.gpu_entry\.gpus, 1\)\)", text)
    assert unquote(decider.variables["ecs_reserved_memory_mib"]["default"]) == sizing.ECS_RESERVED_MIB


def test_the_gpu_catalog_is_the_one_the_plan_sizes_against(stack):
    catalog = plain(stack.modules["decider"].variables["gpu_catalog"]["default"])
    assert catalog.keys() == sizing.INSTANCES.keys()
    for gpu, entry in catalog.items():
        assert entry == {**sizing.INSTANCES[gpu], "sm": resolve_gpu(gpu).sm}, gpu


def test_the_s3_client_gets_the_tasks_region_and_hub_egress_is_declared(stack):
    text = stack.modules["decider"].text()
    block = text[text.index('resource "aws_ecs_task_definition" "triton"'):]
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        assert re.search(rf'\{{ name = "{name}", value = local\.region \}}', block), name
    assert re.search(r'\{ name = "TOOLRAIL_HUB_EGRESS", value = tostring\(var\.engine\.hub_egress\) \}', block)
    rule = plain(stack.modules["decider"].resource("aws_vpc_security_group_egress_rule", "https_hub"))
    assert expr(rule["count"]) == "var.engine.hub_egress ? 1 : 0"
    assert (rule["from_port"], rule["to_port"], rule["cidr_ipv4"]) == (443, 443, "0.0.0.0/0")


@pytest.mark.parametrize("env", ENV_NAMES)
def test_the_committed_engine_variable_is_what_publish_writes(stack, env):
    written = json.loads((ENVS / env / "engine.auto.tfvars.json").read_text())
    assert "engine =" not in (ENVS / env / f"{env}.tfvars").read_text()  # nothing overrides it (-var-file wins)
    sample_manifest = {"key": "0" * 64, **{k: v for k, v in written["engine"].items() if k != "build_key"}}
    assert deploy_variables(sample_manifest) == written
    # The example is the documented default, Qwen2.5-7B-Instruct (its four bf16 shards) with the plan's defaults.
    shape = sizing.ModelShape.from_config({
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "intermediate_size": 18944, "vocab_size": 152064, "torch_dtype": "bfloat16",
    })
    shards = [3_945_487_360, 3_864_726_320, 3_864_726_424, 3_556_377_672]
    gpu = resolve_gpu(written["engine"]["gpu"])
    computed = sizing.size_task(
        backend="pytorch", gpu=gpu, shape=shape, weight_bytes=sum(shards), largest_file_bytes=max(shards), tp=1,
        max_batch_size=64, max_seq_len=5120, max_num_tokens=8192, kv_cache_free_gpu_mem_fraction=0.85,
        host_limit_mib=sizing.host_share_mib(gpu.name, 1),
    )
    assert written["engine"]["task_memory_mib"] == computed.task_memory_mib
    assert written["engine"]["sm"] == gpu.sm


def test_module_readme_documents_the_engine_variable():
    readme = (MODULES / "decider" / "README.md").read_text()
    assert "task_memory_mib" in readme and "engine.auto.tfvars.json" in readme and "AWS_REGION" in readme
