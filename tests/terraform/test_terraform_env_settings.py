"""Every ``TOOLRAIL_*`` variable terraform sets is read by the process it is set for.

The API and worker containers run the toolrail image: their variables must be ``Settings``
fields. The Triton container runs ``docker/triton/entrypoint.py``: its variables must be ones
that entrypoint reads. Decide workers get the Triton model that matches the repository flavour.
"""

from __future__ import annotations

import re

from tf_parse import MODULES, REPO

from toolrail.settings import Settings, env_names

_SET = re.compile(r'(?:name\s*=\s*"|^\s*)(TOOLRAIL_[A-Z0-9_]+|REDIS_URL)(?:"|\s*=)', re.MULTILINE)


def _set_in(module: str) -> set[str]:
    text = "\n".join(path.read_text() for path in (MODULES / module).glob("*.tf"))
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("#", "description")))
    return set(_SET.findall(code))


def _settings_names() -> set[str]:
    return {name for field in Settings.model_fields for name in env_names(field)}


def test_api_and_worker_variables_are_settings():
    api, executor = _set_in("api"), _set_in("executor")
    assert {"TOOLRAIL_HOST", "TOOLRAIL_LOG_FORMAT", "REDIS_URL"} <= api  # the scan sees the container env
    assert {"TOOLRAIL_WORKER_CONCURRENCY", "TOOLRAIL_TRITON_MODEL", "TOOLRAIL_TASK_TIME_LIMIT_S"} <= executor
    unknown = (api | executor) - _settings_names()
    assert not unknown, f"terraform sets variables no Settings field reads: {sorted(unknown)}"


def test_triton_container_variables_are_read_by_its_entrypoint():
    entrypoint = (REPO / "docker" / "triton" / "entrypoint.py").read_text()
    read = set(re.findall(r"""environ(?:\.get)?[\[(]\s*["'](TOOLRAIL_[A-Z0-9_]+)""", entrypoint))
    triton = _set_in("decider")
    assert "TOOLRAIL_ENGINE_MANIFEST_URI" in triton
    assert triton <= read, f"terraform sets variables the Triton entrypoint never reads: {sorted(triton - read)}"


def test_decide_workers_call_the_model_of_the_repository_flavour():
    from engine_build.triton_repo import ENGINE_ENTRY_MODEL, LLMAPI_MODEL

    outputs = (MODULES / "decider" / "outputs.tf").read_text()
    rule = re.search(r'output "triton_model" \{.*?value\s*=\s*(.+?)\n', outputs, re.DOTALL)
    assert rule is not None
    assert rule.group(1).strip() == f'var.engine.backend == "engine" ? "{ENGINE_ENTRY_MODEL}" : "{LLMAPI_MODEL}"'
    executor = (MODULES / "executor" / "main.tf").read_text()
    assert re.search(r"TOOLRAIL_TRITON_MODEL\s*=\s*each\.value\.needs_triton \? var\.triton_model", executor)
    for env in ("dev", "prod"):
        main = (REPO / "terraform" / "envs" / env / "main.tf").read_text()
        assert re.search(r"triton_model\s*=\s*module\.decider\.triton_model", main), env
    # the default matches the default flavour of the pinned TensorRT-LLM (>= 1.0: pytorch → llmapi)
    assert Settings.model_fields["triton_model"].default == LLMAPI_MODEL
