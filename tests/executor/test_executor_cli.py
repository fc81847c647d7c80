"""The executor's CLI commands as a user runs them (real subprocesses)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]


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


class _SlowJobAPI(http.server.BaseHTTPRequestHandler):
    """An API whose one job never ends: its event stream stays open as long as asked (``timeout_s``), as the real
    one does, and the record stays ``running``."""

    JOB = {"job_id": "job_slow", "request_id": "req_slow", "status": "running", "calls": [], "attempts": []}

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._json(202, {"job_id": "job_slow", "request_id": "req_slow", "status": "queued"})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        if url.path.endswith("/events"):
            hold = float(urllib.parse.parse_qs(url.query).get("timeout_s", ["30"])[0])
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"type": "status", "status": "running"}\n\n')
            self.wfile.flush()
            time.sleep(min(hold, 30))
            return
        self._json(200, self.JOB)


@pytest.fixture()
def slow_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowJobAPI)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("mode", [[], ["--json"]], ids=["events", "json"])
def test_run_timeout_is_one_deadline(slow_api: str, mode: list[str]) -> None:
    """``--timeout 4`` ends the command at 4 s: the event stream and the polling after it share the deadline (it was
    4 s of events, then 4 s more of polling), and a job still running is said so, exit 124."""
    started = time.monotonic()  # the interpreter's start and the imports, as loaded as this machine is now
    assert toolrail("run", "hello", "--url", "http://127.0.0.1:9", "--timeout", "4", *mode).returncode == 1  # refused
    start_s = time.monotonic() - started
    started = time.monotonic()
    out = toolrail("run", "hello", "--url", slow_api, "--timeout", "4", *mode)
    elapsed = time.monotonic() - started
    assert out.returncode == 124, out.stderr
    assert "--timeout 4 s passed; job job_slow is still running" in out.stderr
    # one deadline: 4 s and the start (two were 8 s and the start)
    assert elapsed < 4 + start_s + 1.5, f"{elapsed:.1f} s for --timeout 4, {start_s:.1f} s to start"


def test_run_timeout_counts_the_local_stack_start() -> None:
    """Without ``--url`` the deadline starts with the command: a local stack slower to start than ``--timeout`` is
    stopped (nothing is submitted) and the command says so, exit 124, without a traceback of the pool it kills."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # its own embedded Redis, as a user's run
    out = subprocess.run([sys.executable, "-m", "toolrail.cli", "run", "hello", "--tools", "get_weather", "--timeout",
                          "0.5"], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert out.returncode == 124, out.stderr
    assert "--timeout 0.5 s passed while the local stack started" in out.stderr
    assert "Traceback" not in out.stderr and "job " not in out.stderr, out.stderr
