"""Publish → S3 → the Triton entrypoint, against moto's S3 server that answers only in its region.

The default cloud flavour (pytorch, LLM API) must find its weights in the published prefix: the
task reaches only the VPC and S3, so a hub id is refused unless the deployment declares egress.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest
from test_engine_build_run import _console
from test_engine_publish import _entrypoint

from engine_build.build import build
from engine_build.plan import BuildOptions, plan_build
from engine_build.publish import PublishError, publish, publish_layout
from engine_build.triton_repo import LLMAPI_MODEL, RepoOptions, write_triton_repo

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")
from botocore.exceptions import ClientError  # noqa: E402

from engine_build.s3_double import S3Double  # noqa: E402

REGION = "eu-west-1"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture
def s3(monkeypatch):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")  # no region from a config file on this machine
    with S3Double(REGION) as double:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", double.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        client = boto3.client("s3", region_name=REGION, **CREDENTIALS)
        bucket = f"artifacts-{uuid.uuid4().hex[:12]}"  # moto's state outlives one server in this process
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield double, client, bucket


def _pytorch_build(model: str, tmp_path, tiny_tokenizer, *, server_model: str | None = None):
    plan = plan_build(BuildOptions(model=model, gpu="h100", trtllm_version="1.0.0", output_root=tmp_path / "engines"))
    build(plan, console=_console(), check=False)
    layout = publish_layout(plan.key, backend="pytorch")
    write_triton_repo(
        RepoOptions(flavor="pytorch", output=plan.out_dir / "triton_repo", model=server_model or layout["server_model"],
                    tokenizer_dir=layout["server_tokenizer_dir"], server_root=layout["server_root"],
                    llm_api_options=plan.llm_api_options),
        tiny_tokenizer,
    )
    return plan


def test_the_llm_api_flavour_serves_published_weights_fetched_in_the_tasks_region(s3, tiny_model_dir, tiny_tokenizer,
                                                                                  tmp_path, monkeypatch):
    double, client, bucket = s3
    plan = _pytorch_build(str(tiny_model_dir), tmp_path, tiny_tokenizer)
    result = publish(plan.out_dir, f"s3://{bucket}/engines", client=client)
    manifest = json.loads(client.get_object(Bucket=bucket, Key=f"engines/{plan.key}/manifest.json")["Body"].read())
    assert {"model/model.safetensors", "model/config.json", "model/tokenizer.json", "llm_api_options.yaml"} <= set(manifest["files"])
    assert not any("tokenizer_info" in name for name in manifest["files"])  # nothing on the server reads one
    assert manifest["model_source"] == "published" and result.deploy["engine"]["backend"] == "pytorch"
    assert manifest["sizing"]["processes"] == {"llmapi": {"count": 2, "mib": 4096}}

    entrypoint = _entrypoint()
    with pytest.raises(entrypoint.EngineRejected, match="no AWS region"):
        entrypoint.region_from({})
    monkeypatch.setenv("AWS_REGION", REGION)
    task_client = boto3.client("s3", region_name=entrypoint.region_from(dict(os.environ)))
    engine_dir, fetched = entrypoint.fetch_build(task_client, result.manifest_uri, tmp_path / "host",
                                                 trtllm_version="1.0.0", gpu_sms=[90], hub_egress=False)
    assert (engine_dir / "model" / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    repository = entrypoint.model_repository(engine_dir, hint=fetched["model_repository"])
    served = (repository / LLMAPI_MODEL / "config.pbtxt").read_text()
    assert f'string_value: "/engines/{plan.key}/model"' in served
    assert "xgrammar_tokenizer_info_path" not in served and "tokenizer_dir" not in served
    assert entrypoint.server_argv(repository, [])[1] == f"--model-repository={repository}"
    assert double.check.refused == []

    # A client without a region signs for us-east-1: the bucket's region refuses it, as S3 would.
    monkeypatch.delenv("AWS_REGION")
    regionless = boto3.client("s3")
    with pytest.raises(ClientError, match="AuthorizationHeaderMalformed"):
        regionless.get_object(Bucket=bucket, Key=f"engines/{plan.key}/manifest.json")
    assert double.check.refused and "us-east-1" in double.check.refused[-1]


def test_a_hub_id_is_refused_unless_the_deployment_declares_egress(s3, tiny_model_dir, tiny_tokenizer, tmp_path):
    _double, client, bucket = s3
    plan = _pytorch_build("Qwen/Qwen2.5-0.5B-Instruct", tmp_path, tiny_tokenizer, server_model="Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(PublishError, match="hub id.*--hub-egress"):
        publish(plan.out_dir, f"s3://{bucket}/engines", tokenizer_dir=tiny_model_dir, client=client)
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0

    result = publish(plan.out_dir, f"s3://{bucket}/engines", tokenizer_dir=tiny_model_dir, hub_egress=True, client=client)
    assert result.deploy["engine"]["hub_egress"] is True
    entrypoint = _entrypoint()
    with pytest.raises(entrypoint.EngineRejected, match="declares no egress"):
        entrypoint.fetch_build(client, result.manifest_uri, tmp_path / "host", trtllm_version="1.0.0", gpu_sms=[90],
                               hub_egress=False)
    engine_dir, _ = entrypoint.fetch_build(client, result.manifest_uri, tmp_path / "host", trtllm_version="1.0.0",
                                           gpu_sms=[90], hub_egress=True)
    assert not (engine_dir / "model" / "model.safetensors").exists()  # the server downloads it through the declared egress


def test_a_repository_pointing_the_llm_api_elsewhere_is_refused(s3, tiny_model_dir, tiny_tokenizer, tmp_path):
    _double, client, bucket = s3
    plan = _pytorch_build(str(tiny_model_dir), tmp_path, tiny_tokenizer, server_model="Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(PublishError, match="not the published weights"):
        publish(plan.out_dir, f"s3://{bucket}/engines", client=client)


def test_cli_writes_terraforms_engine_variable(s3, tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    from toolrail.cli import main

    _double, _client, bucket = s3
    monkeypatch.setenv("AWS_REGION", REGION)
    plan = _pytorch_build(str(tiny_model_dir), tmp_path, tiny_tokenizer)
    tfvars = tmp_path / "engine.auto.tfvars.json"
    assert main(["engine", "publish", "--build-dir", str(plan.out_dir), "--to", f"s3://{bucket}/engines",
                 "--tfvars", str(tfvars)]) == 0
    engine = json.loads(tfvars.read_text())["engine"]
    assert engine["build_key"] == plan.key and engine["task_memory_mib"] > 0 and engine["hub_egress"] is False
    assert "terraform engine variable" in capsys.readouterr().out


def test_the_double_serves_on_a_moto_without_its_request_handler(monkeypatch):
    """moto 5.2.1 (an image's system Python, which the GPU script's venv inherits) has no ``MotoRequestHandler``:
    the double falls back to werkzeug's handler and still answers S3 in its region (issue 38)."""
    from moto.moto_server import werkzeug_app

    monkeypatch.delattr(werkzeug_app, "MotoRequestHandler", raising=False)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with S3Double(REGION) as double:
        client = boto3.client("s3", region_name=REGION, endpoint_url=double.url, **CREDENTIALS)
        bucket = f"old-moto-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        client.put_object(Bucket=bucket, Key="k", Body=b"v")
        assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
