"""docker/: the API/worker image and the Triton + TensorRT-LLM image, and the Triton entrypoint."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from tf_parse import REPO, unquote

DOCKER = REPO / "docker"

# NVIDIA's Triton release compatibility matrix, container trtllm-python-py3.
TRITON_TRTLLM = {"25.01": "0.17.0", "25.07": "0.20.0", "25.08": "0.21.0", "25.09": "1.0.0", "25.10": "1.0.0", "25.12": "1.1.0"}

_spec = importlib.util.spec_from_file_location("toolrail_triton_entrypoint", DOCKER / "triton" / "entrypoint.py")
entrypoint = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = entrypoint
_spec.loader.exec_module(entrypoint)


def _arg(dockerfile: str, name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", dockerfile, flags=re.M)
    return value


def test_triton_image_pairs_the_release_with_its_trtllm_version(stack):
    text = (DOCKER / "Dockerfile.triton").read_text()
    release, trtllm = _arg(text, "TRITON_RELEASE"), _arg(text, "TRTLLM_VERSION")
    assert "FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3" in text
    assert TRITON_TRTLLM[release] == trtllm
    assert unquote(stack.modules["decider"].variables["triton_trtllm_version"]["default"]) == trtllm
    for env in ("dev", "prod"):
        assert unquote(stack.envs[env].variables["triton_trtllm_version"]["default"]) == trtllm
        assert stack.tfvars(env)["engine"]["trtllm_version"] == trtllm
    assert "USER triton-server" in text and "entrypoint.py" in text


def test_app_image_installs_the_package_and_runs_unprivileged():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim", text, flags=re.M)
    assert "pip install ." in text
    assert re.search(r"^USER 10001", text, flags=re.M)
    assert 'CMD ["toolrail", "serve", "--no-worker"]' in text
    assert "/healthz" in text


def test_task_commands_match_the_cli(stack):
    assert '["toolrail", "serve", "--no-worker"]' in stack.modules["api"].text()
    assert '["toolrail", "worker", "-Q", join(",", each.value.queues)]' in stack.modules["executor"].text()


def test_manifest_files_accepts_mapping_and_list():
    assert entrypoint.manifest_files({"files": {"a/config.pbtxt": "00"}}) == {"a/config.pbtxt": "00"}
    assert entrypoint.manifest_files({"files": [{"path": "rank0.engine", "sha256": "11"}]}) == {"rank0.engine": "11"}


@pytest.mark.parametrize("bad", ["../etc/passwd", "/abs", "a/../../b", ""])
def test_manifest_paths_cannot_escape_the_engine_dir(tmp_path, bad):
    with pytest.raises(entrypoint.EngineRejected):
        entrypoint.safe_target(tmp_path, bad)


def test_engine_must_match_trtllm_version_and_gpu_sm():
    manifest = {"sm": 90, "trtllm_version": "1.0.0"}
    entrypoint.check_compatibility(manifest, trtllm_version="1.0.0", gpu_sms=[90, 90])
    with pytest.raises(entrypoint.EngineRejected, match="TensorRT-LLM"):
        entrypoint.check_compatibility(manifest, trtllm_version="1.1.0", gpu_sms=[90])
    with pytest.raises(entrypoint.EngineRejected, match="sm89"):
        entrypoint.check_compatibility(manifest, trtllm_version="1.0.0", gpu_sms=[89])
    with pytest.raises(entrypoint.EngineRejected, match="no GPU"):
        entrypoint.check_compatibility(manifest, trtllm_version="1.0.0", gpu_sms=[])


def test_model_repository_is_found_by_its_config_files(tmp_path):
    (tmp_path / "triton_model_repo" / "tensorrt_llm_bls").mkdir(parents=True)
    (tmp_path / "triton_model_repo" / "tensorrt_llm_bls" / "config.pbtxt").write_text('name: "tensorrt_llm_bls"')
    assert entrypoint.model_repository(tmp_path) == tmp_path / "triton_model_repo"
    assert entrypoint.model_repository(tmp_path, hint="triton_model_repo") == tmp_path / "triton_model_repo"


def test_s3_uri_parsing():
    assert entrypoint.parse_s3_uri("s3://b/engines/k/manifest.json") == ("b", "engines/k/manifest.json")
    with pytest.raises(ValueError):
        entrypoint.parse_s3_uri("https://b/k")
