"""The configuration reference is generated from ``Settings`` and stays in sync with the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolrail.config_cli import DEFAULT_DOCS_PATH
from toolrail.config_docs import render_markdown
from toolrail.settings import OTHER_VARIABLES, Settings, env_names

REPO = Path(__file__).resolve().parents[2]
#: Package code and images: every TOOLRAIL_* variable read there must be documented.
CODE_ROOTS = ("toolrail", "executor", "decider", "tools", "engine_build", "docker")


def test_docs_file_matches_settings():
    assert DEFAULT_DOCS_PATH.read_text() == render_markdown(), "docs/configuration.md is stale: run `toolrail config docs`"


def test_every_setting_documented_with_env_name_type_default_and_description():
    text = render_markdown()
    assert "PydanticUndefined" not in text  # a default_factory's default is shown, not pydantic's marker
    assert "| `TOOLRAIL_APPROVAL_POLICIES` | JSON object | `{}` |" in text
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no docstring"
        row = next((line for line in text.splitlines() if line.startswith(f"| `{env_names(name)[0]}`")), None)
        assert row is not None, f"{name} missing from the reference"
        assert row.count(" | ") >= 3


def test_check_flag_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(render_markdown().replace("TOOLRAIL_WORKER_CONCURRENCY", "TOOLRAIL_WORKERS"))
    run = subprocess.run([sys.executable, "-m", "toolrail.cli", "config", "docs", "--check", "--output", str(stale)],
                         capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 1 and "out of date" in run.stderr
    fresh = subprocess.run([sys.executable, "-m", "toolrail.cli", "config", "docs", "--output", str(stale)],
                           capture_output=True, text=True, cwd=REPO)
    assert fresh.returncode == 0 and stale.read_text() == render_markdown()


def test_readme_settings_point_to_the_reference_and_name_real_settings():
    readme = (REPO / "README.md").read_text()
    assert "docs/configuration.md" in readme
    known = {n for name in Settings.model_fields for n in env_names(name)} | set(OTHER_VARIABLES)
    named = set(re.findall(r"`(TOOLRAIL_[A-Z0-9_]+|REDIS_URL)[=`]", readme))
    assert named, "the README lists no settings"
    assert named <= known, f"README names variables that are not settings: {sorted(named - known)}"


def test_every_toolrail_variable_read_by_the_code_is_documented():
    documented = {n for name in Settings.model_fields for n in env_names(name)} | set(OTHER_VARIABLES)
    read: dict[str, str] = {}
    for root in CODE_ROOTS:
        for path in (REPO / root).rglob("*.py"):
            # every complete string literal: environ lookups and constants that name a variable
            for name in re.findall(r"""["'](TOOLRAIL_[A-Z0-9_]+)["']""", path.read_text()):
                read.setdefault(name, str(path.relative_to(REPO)))
    assert "TOOLRAIL_TOOL_MODULES" in read  # the scan finds what it should
    undocumented = {name: where for name, where in read.items() if name not in documented}
    assert not undocumented, f"read but not documented in Settings or OTHER_VARIABLES: {undocumented}"


@pytest.mark.parametrize(("value", "expected"), [("json", "json"), ("console", "console"), ("1", "json"), ("0", "console")])
def test_log_format_and_its_older_spelling(monkeypatch, value, expected):
    monkeypatch.delenv("TOOLRAIL_LOG_JSON", raising=False)
    monkeypatch.setenv("TOOLRAIL_LOG_FORMAT" if value in {"json", "console"} else "TOOLRAIL_LOG_JSON", value)
    assert Settings().log_format == expected


@pytest.mark.parametrize(("fmt", "is_json"), [("json", True), ("console", False)])
def test_log_format_drives_the_renderer(fmt, is_json):
    code = ("from toolrail.logging import get_logger; get_logger('t').info('probe', answer=42)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "TOOLRAIL_LOG_FORMAT": fmt, "TOOLRAIL_ENVIRONMENT": "staging"})
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("{") is is_json, line
    assert "staging" in line and "probe" in line


def test_invalid_setting_is_one_line_naming_the_variable():
    run = subprocess.run([sys.executable, "-m", "toolrail.cli", "config", "show"], capture_output=True, text=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "TOOLRAIL_WORKER_CONCURRENCY": "many"})
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert run.stderr.startswith("toolrail: invalid setting TOOLRAIL_WORKER_CONCURRENCY")


def test_config_show_masks_secrets():
    run = subprocess.run([sys.executable, "-m", "toolrail.cli", "config", "show"], capture_output=True, text=True, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "TOOLRAIL_API_KEYS": "key-zq9:acme",
                              "REDIS_URL": "redis://:pw-xq7@h:6379/0"})
    assert run.returncode == 0, run.stderr
    assert "key-zq9" not in run.stdout and "pw-xq7" not in run.stdout and "***@h:6379" in run.stdout
