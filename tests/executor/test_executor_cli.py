"""The executor's CLI commands as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def toolrail(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolrail.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_repair_prints_clean_arguments_and_exits_0() -> None:
    out = toolrail("repair", "--tool", "get_weather", "--notes", stdin="```json\n{“city”：“沪”，“date”：“明天”，}\n```")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"city": "Shanghai", "date": "tomorrow", "unit": "celsius"}
    assert "alias" in out.stderr


def test_repair_unwraps_a_whole_call() -> None:
    out = toolrail("repair", "--tool", "query_balance", stdin='{"name": "query_balance", "arguments": {"account": "alice"}}')
    assert out.returncode == 0 and json.loads(out.stdout) == {"account": "alice"}


@pytest.mark.parametrize("raw", ['{"city": "北京", "date": "后天"}', '{"city": "Beijing", "date": "today", "x": 1}', "",
                                 '{"city": "Beij'])
def test_repair_reports_typed_errors_and_exits_2(raw: str) -> None:
    out = toolrail("repair", "--tool", "get_weather", stdin=raw)
    assert out.returncode == 2 and out.stdout == ""
    error = json.loads(out.stderr.strip().splitlines()[-1])["error"]
    assert error["type"] == "invalid_arguments" and error["details"]["errors"]


def test_repair_unknown_tool_exits_2() -> None:
    out = toolrail("repair", "--tool", "nope", stdin="{}")
    assert out.returncode == 2 and "unknown_tool" in out.stderr


def test_serve_refuses_public_bind_without_keys() -> None:
    out = toolrail("serve", "--host", "0.0.0.0", "--no-worker", env={"TOOLRAIL_API_KEYS": ""})
    assert out.returncode == 2 and "refusing to bind 0.0.0.0" in out.stderr


def test_run_without_input_explains_itself() -> None:
    out = toolrail("run", "--url", "http://127.0.0.1:9")
    assert out.returncode != 0 and "give a prompt" in out.stderr


@pytest.mark.parametrize("command", ["serve", "worker", "repair", "run", "demo", "model", "generate", "engine"])
def test_every_command_has_help(command: str) -> None:
    out = toolrail(command, "--help")
    assert out.returncode == 0 and "usage: toolrail" in out.stdout
