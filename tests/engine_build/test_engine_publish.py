"""``toolrail engine publish``: a build, its tokenizer and its repository to S3, manifest last; the entrypoint's view."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from python_backend_host import RELEASES
from test_engine_build_run import FakeRunner, _console, _fake_actions

from engine_build.build import build
from engine_build.errors import DoesNotFitError
from engine_build.manifest import Manifest
from engine_build.plan import BuildOptions, plan_build
from engine_build.publish import PublishError, publish, publish_layout
from engine_build.triton_repo import RepoOptions, write_triton_repo

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _entrypoint():
    spec = importlib.util.spec_from_file_location("toolrail_triton_entrypoint_publish", DOCKER / "triton" / "entrypoint.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class FakeS3:
    """Records boto3 S3 client calls in order; keeps the bytes."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], bytes] = {}
        self.order: list[str] = []

    def upload_file(self, Filename, Bucket, Key):
        self.objects[(Bucket, Key)] = Path(Filename).read_bytes()
        self.order.append(Key)

    def put_object(self, *, Bucket, Key, Body, ContentType):
        self.objects[(Bucket, Key)] = Body
        self.order.append(Key)


@pytest.fixture
def finished_build(tiny_model_dir, tmp_path, tiny_tokenizer):
    plan = plan_build(BuildOptions(model=str(tiny_model_dir), gpu="h100", trtllm_version="0.19.0",
                                   output_root=tmp_path / "engines"))
    build(plan, runner=FakeRunner(plan), actions=_fake_actions([]), console=_console(), check=False)
    return plan


def _write_repo(plan, tiny_tokenizer, **layout):
    return write_triton_repo(
        RepoOptions(flavor="engine", output=plan.out_dir / "triton_repo", model=layout.pop("server_tokenizer_dir"),
                    engine_dir=layout["engine_dir"], server_root=layout["server_root"], model_code_from=RELEASES["v0.19.0"]),
        tiny_tokenizer,
    )


def test_publish_uploads_everything_then_the_manifest(finished_build, tiny_tokenizer, tmp_path):
    plan = finished_build
    _write_repo(plan, tiny_tokenizer, **publish_layout(plan.key))
    s3 = FakeS3()
    result = publish(plan.out_dir, "s3://artifacts/engines", client=s3)
    assert result.manifest_uri == f"s3://artifacts/engines/{plan.key}/manifest.json"
    assert s3.order[-1] == f"engines/{plan.key}/manifest.json" and s3.order.count(s3.order[-1]) == 1
    manifest = json.loads(s3.objects[("artifacts", s3.order[-1])])
    published = {key.removeprefix(f"engines/{plan.key}/") for key in s3.order[:-1]}
    assert set(manifest["files"]) == published
    assert {"engine/rank0.engine", "model/tokenizer.json", "model/config.json", "triton_repo/tensorrt_llm/config.pbtxt",
            "triton_repo/tensorrt_llm_bls/1/model.py", "build_manifest.json"} <= published
    assert (manifest["key"], manifest["trtllm_version"], manifest["sm"]) == (plan.key, "0.19.0", 90)
    # The task's memory comes from what was published: the repository's BLS count, the engine's bytes.
    assert manifest["sizing"]["processes"]["tensorrt_llm_bls"]["count"] == plan.sizing.bls_instances
    assert manifest["task_memory_mib"] == manifest["sizing"]["task_memory_mib"] > 0
    assert result.deploy == {"engine": {"build_key": plan.key, "gpu": "h100", "sm": 90, "trtllm_version": "0.19.0",
                                        "backend": "engine", "task_memory_mib": manifest["task_memory_mib"],
                                        "hub_egress": False}}

    # The entrypoint's side: fetch what the manifest lists, check every sha256, find the repository.
    entrypoint = _entrypoint()
    entrypoint.check_compatibility(manifest, trtllm_version="0.19.0", gpu_sms=[90])
    engine_dir = tmp_path / "host" / plan.key
    for relative, digest in entrypoint.manifest_files(manifest).items():
        target = entrypoint.safe_target(engine_dir, relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s3.objects[("artifacts", f"engines/{plan.key}/{relative}")])
        assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    repository = entrypoint.model_repository(engine_dir, hint=manifest["model_repository"])
    assert (repository / "tensorrt_llm_bls" / "config.pbtxt").is_file()


def test_publish_refuses_a_task_that_does_not_fit_with_the_numbers(finished_build, tiny_tokenizer):
    plan = finished_build
    _write_repo(plan, tiny_tokenizer, **publish_layout(plan.key))
    manifest = Manifest.read(plan.out_dir)
    manifest.sizing["host_limit_mib"] = 8192  # a small instance: 64 BLS processes importing torch do not fit
    manifest.write(plan.out_dir)
    s3 = FakeS3()
    with pytest.raises(DoesNotFitError, match=r"needs \d+ MiB of host memory.*8192 MiB.*tensorrt_llm_bls 64×512") as info:
        publish(plan.out_dir, "s3://artifacts/engines", client=s3)
    assert info.value.numbers["task_memory_mib"] > 8192 and s3.order == []


def test_publish_refuses_a_repository_written_for_another_layout(finished_build, tiny_tokenizer):
    plan = finished_build
    _write_repo(plan, tiny_tokenizer, server_root="/srv/repo", engine_dir="/somewhere/engine",
                server_tokenizer_dir="/models/tiny")
    s3 = FakeS3()
    with pytest.raises(PublishError, match="outside /engines/"):
        publish(plan.out_dir, "s3://artifacts/engines", client=s3)
    assert s3.order == []  # nothing uploaded, so no manifest points at a broken layout


def test_publish_needs_the_repository(finished_build):
    with pytest.raises(PublishError, match="triton-repo"):
        publish(finished_build.out_dir, "s3://artifacts/engines", client=FakeS3())


def test_cli_prints_the_layout_to_generate_the_repository_with(finished_build, capsys):
    from toolrail.cli import main

    assert main(["engine", "publish", "--build-dir", str(finished_build.out_dir), "--print-layout"]) == 0
    out = capsys.readouterr().out
    assert f"--server-root /engines/{finished_build.key}/triton_repo" in out
    assert f"--engine-dir /engines/{finished_build.key}/engine" in out
