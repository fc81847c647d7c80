"""Sandbox escapes: each attempt fails, the call ends with a typed error, the sandbox keeps serving.

Real child processes with real limits (``ProcessSandbox``), no Celery; the last tests go
through the session's real worker pool and API to show a Celery worker survives the
limit-breaking tools too.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.harness.jobs import wait_terminal

from executor.errors import SandboxError
from executor.sandbox.boundary import CallRun
from executor.sandbox.child import SANDBOX_UID_BASE
from executor.sandbox.process import ProcessSandbox
from tests.chaos.hostile_tools import ESCAPE_SPEC

ROOT = os.geteuid() == 0
SECRET_VALUE = "worker-only-secret-7f3a"
FAST_CPU_SPEC = ESCAPE_SPEC.model_copy(update={"cpu_s": 1})


@pytest.fixture(scope="module")
def sandbox() -> Iterator[ProcessSandbox]:
    os.environ["TOOLRAIL_SANDBOX_ESCAPE_SECRET"] = SECRET_VALUE  # in the parent's environment, never the child's
    box = ProcessSandbox(warm=1, preload="tools.builtin,tests.chaos.hostile_tools")
    yield box
    box.close()
    os.environ.pop("TOOLRAIL_SANDBOX_ESCAPE_SECRET", None)


@pytest.fixture(scope="module")
def secret_file() -> Iterator[Path]:
    """A world-readable file outside the scratch dir: only the sandbox may keep a tool from it."""
    folder = Path(tempfile.mkdtemp(prefix="toolrail-secret-"))
    path = folder / "credentials"
    path.write_text(SECRET_VALUE)
    path.chmod(0o644)
    folder.chmod(0o755)
    yield path
    path.unlink(missing_ok=True)
    folder.rmdir()


def attempt(box: ProcessSandbox, mode: str, target: str = "", spec=ESCAPE_SPEC) -> SandboxError:
    """Run one escape attempt; it must end in a typed SandboxError."""
    try:
        result = box.run(spec, CallRun(request_id="req-escape", job_id="job-escape", call_id=f"call-{mode}",
                                       idempotency_key="k", arguments={"mode": mode, "target": target}))
    except SandboxError as exc:
        return exc
    raise AssertionError(f"escape {mode!r} succeeded: {result.result}")


def still_serves(box: ProcessSandbox) -> None:
    result = box.run(ESCAPE_SPEC, CallRun(request_id="req-ok", job_id="job-ok", call_id="call-ok", idempotency_key="k",
                                          arguments={"mode": "ok"}))
    assert result.result["ok"] is True
    if ROOT:
        assert result.result["uid"] >= SANDBOX_UID_BASE and result.isolation["uid"] == str(result.result["uid"])


def uid_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.split() and int(line.split()[0]) >= SANDBOX_UID_BASE]


def test_isolation_layers_are_applied(sandbox: ProcessSandbox) -> None:
    result = sandbox.run(ESCAPE_SPEC, CallRun(request_id="r", job_id="j", call_id="c", idempotency_key="k",
                                              arguments={"mode": "ok"}))
    iso = result.isolation
    assert iso["network"] in {"netns", "userns+netns"}
    assert iso["ipc"] == "ipcns" and iso["pid"] == "pidns" and iso["scratch"] == "own-mount"
    assert result.result["cwd"].startswith(str(Path(tempfile.gettempdir()) / "toolrail-scratch"))
    if ROOT:
        assert iso["uid"].isdigit() and int(iso["uid"]) == SANDBOX_UID_BASE + result.pid
    assert iso["filesystem"].startswith("landlock") or iso["filesystem"].startswith("unavailable")


def test_worker_secret_env_is_out_of_reach(sandbox: ProcessSandbox) -> None:
    error = attempt(sandbox, "env_secret", "TOOLRAIL_SANDBOX_ESCAPE_SECRET")
    # not in the scrubbed environment, and the parent's /proc/<pid>/environ is refused
    assert error.type == "sandbox_denied", error.to_dict()
    assert "environ" in str(error)
    still_serves(sandbox)


def test_files_outside_scratch_cannot_be_read(sandbox: ProcessSandbox, secret_file: Path) -> None:
    for target in (str(secret_file), "/etc/passwd", str(Path(__file__).resolve().parents[2] / "pyproject.toml")):
        error = attempt(sandbox, "read_file", target)
        assert error.type == "sandbox_denied", (target, error.to_dict())
        assert SECRET_VALUE not in str(error.to_dict())
    still_serves(sandbox)


def test_writes_outside_scratch_are_refused(sandbox: ProcessSandbox) -> None:
    target = Path(tempfile.gettempdir()) / f"toolrail-escaped-{os.getpid()}"
    error = attempt(sandbox, "write_file", str(target))
    assert error.type == "sandbox_denied", error.to_dict()
    assert not target.exists()
    still_serves(sandbox)


@pytest.mark.alone  # counts every per-call uid's processes on the machine
@pytest.mark.skipif(not ROOT, reason="RLIMIT_NPROC binds only a uid of the call's own (needs root to switch)")
def test_fork_bomb_hits_the_process_limit_and_is_cleaned_up(sandbox: ProcessSandbox) -> None:
    started = time.monotonic()
    error = attempt(sandbox, "fork_bomb")
    assert error.type == "tool_process_limit", error.to_dict()
    assert time.monotonic() - started < ESCAPE_SPEC.timeout_s
    assert uid_processes() == []
    still_serves(sandbox)


def test_memory_past_the_limit_is_a_memory_error(sandbox: ProcessSandbox) -> None:
    error = attempt(sandbox, "memory")
    assert error.type == "tool_memory_limit", error.to_dict()
    still_serves(sandbox)


def test_cpu_past_the_limit_is_a_cpu_error(sandbox: ProcessSandbox) -> None:
    error = attempt(sandbox, "cpu", spec=FAST_CPU_SPEC)
    assert error.type == "tool_cpu_limit", error.to_dict()
    still_serves(sandbox)


def test_network_is_unreachable_when_not_declared(sandbox: ProcessSandbox, redis_url: str) -> None:
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    for target in (f"127.0.0.1:{port}", "1.1.1.1:53"):  # a live local service, and the outside
        error = attempt(sandbox, "network", target)
        assert error.type == "sandbox_denied", (target, error.to_dict())
    still_serves(sandbox)


@pytest.mark.alone  # looks for every left-over sleep(60) on the machine
@pytest.mark.parametrize("mode", ["leave_child", "leave_daemon"])
def test_processes_left_after_return_are_killed_and_reported(sandbox: ProcessSandbox, mode: str) -> None:
    error = attempt(sandbox, mode)
    assert error.type == "tool_left_process", error.to_dict()
    assert error.details["processes"] >= 1  # one level deep: the sandbox's own details
    time.sleep(0.1)
    assert [p for p in uid_processes() if "sleep(60)" in p] == []
    out = subprocess.run(["pgrep", "-f", "time.sleep\\(60\\)"], capture_output=True, text=True).stdout.split()
    assert out == [], f"leftover processes survived: {out}"
    still_serves(sandbox)


def test_tool_cannot_signal_the_worker(sandbox: ProcessSandbox) -> None:
    error = attempt(sandbox, "signal_parent")
    # its parent (the monitor) is outside the tool's PID namespace: no such process there; without one, refused
    assert error.type == "sandbox_denied" or "ProcessLookupError" in str(error), error.to_dict()
    still_serves(sandbox)


def test_a_call_cannot_leave_system_v_ipc_for_a_later_call(sandbox: ProcessSandbox) -> None:
    """Shared memory made world-readable by one call (one tenant) is not there for the next (another tenant)."""
    left = sandbox.run(ESCAPE_SPEC, CallRun(request_id="req-ipc", job_id="job-ipc", call_id="call-ipc-put",
                                            idempotency_key="k", arguments={"mode": "ipc_put", "target": "secret"}))
    assert left.result == {"left": True}  # the tool may use IPC within its own call
    error = attempt(sandbox, "ipc_get")
    assert "shmget" in str(error) or error.type == "sandbox_denied", error.to_dict()
    still_serves(sandbox)


def test_spawn_per_call_has_the_same_isolation() -> None:
    box = ProcessSandbox(warm=0, preload="tools.builtin,tests.chaos.hostile_tools")
    try:
        assert attempt(box, "write_file", "/tmp/toolrail-escaped-cold").type == "sandbox_denied"
        still_serves(box)
    finally:
        box.close()


# ----------------------------------------------------------------- through Celery


def _run_stress(client: httpx.Client, mode: str, amount: float) -> dict:
    response = client.post("/v1/jobs", json={"tool_calls": [{"name": "stress", "arguments": {"mode": mode, "amount": amount}}]})
    assert response.status_code == 202, response.text
    return wait_terminal(client, response.json()["job_id"], timeout_s=60)


@pytest.mark.parametrize(("mode", "amount", "error_types"), [
    ("allocate", 2048, {"tool_memory_limit"}),
    # stress: 2 s of CPU within 3 s of wall clock; on a busy machine the wall clock may win
    ("spin", 30, {"tool_cpu_limit", "tool_timeout"}),
    ("crash", 0, {"tool_crashed"}),
])
def test_worker_keeps_serving_after_a_limit_breaking_call(client: httpx.Client, mode: str, amount: float,
                                                          error_types: set[str]) -> None:
    job = _run_stress(client, mode, amount)
    assert job["status"] == "failed"
    assert job["calls"][0]["error"]["type"] in error_types, job["calls"][0]["error"]
    assert job["error"]["type"] == "tool_failed"
    healthy = _run_stress(client, "ok", 0)
    assert healthy["status"] == "succeeded", healthy
