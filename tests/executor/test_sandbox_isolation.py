"""Per-call isolation and the result channel, against the real sandbox and a real worker.

The findings of the attack report each become a test here: one call reading another's
concurrent scratch file, a result forged on stdout or through a descriptor, results that
are not objects, too deep or too large, hundreds of megabytes of output, a fork bomb
under a non-root worker. Every one must end the call with a typed error — the job ends,
the worker stays up and within a memory bound — and the layers each mode applies are
asserted from the sandbox's own report (written before any tool code runs).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from executor.errors import SandboxError
from executor.sandbox.boundary import CallRun
from executor.sandbox.process import ProcessSandbox, ScratchRootError, prepare_scratch_root
from executor.job_client import wait_for_job
from executor.sandbox.answer import MAX_RESULT_BYTES, MAX_RESULT_DEPTH
from executor.stack import start_worker, stop_process, wait_for_workers
from tests.harness.serving import api_server
from tests.chaos.hostile_tools import ESCAPE_SPEC
from tools.registry import load_registry
from tests.harness.databases import own_database

ROOT_USER = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
PRELOAD = "tools.builtin,tests.chaos.hostile_tools"
#: The most a worker pool process may hold (peak RSS) after a tool printed 300 MB.
WORKER_MEMORY_BOUND_MB = 250


def call(box: ProcessSandbox, mode: str, *, target: str = "", amount: int = 0, call_id: str = "c"):
    return box.run(ESCAPE_SPEC, CallRun(request_id=f"req-{call_id}", job_id="job", call_id=call_id, idempotency_key="k",
                                        arguments={"mode": mode, "target": target, "amount": amount}))


def failure(box: ProcessSandbox, mode: str, **kwargs) -> SandboxError:
    try:
        result = call(box, mode, **kwargs)
    except SandboxError as exc:
        return exc
    raise AssertionError(f"{mode} succeeded: {str(result.result)[:300]}")


@pytest.fixture(scope="module")
def box() -> Iterator[ProcessSandbox]:
    sandbox = ProcessSandbox(preload=PRELOAD)
    yield sandbox
    sandbox.close()


# ----------------------------------------------------------------- the scratch root


def test_scratch_root_is_created_private_and_an_open_one_is_closed(tmp_path: Path) -> None:
    created = prepare_scratch_root(tmp_path / "scratch")
    assert stat.S_IMODE(created.stat().st_mode) == 0o700 and created.stat().st_uid == os.geteuid()
    created.chmod(0o777)
    prepare_scratch_root(created)
    assert stat.S_IMODE(created.stat().st_mode) == 0o700


def test_a_scratch_root_of_someone_else_or_a_symlink_is_refused(tmp_path: Path) -> None:
    if ROOT_USER:
        foreign = tmp_path / "planted"
        foreign.mkdir()
        os.chown(foreign, 4242, 4242)
    else:
        foreign = Path("/usr")  # owned by root, never by a non-root worker
    with pytest.raises(ScratchRootError, match="belongs to uid") as caught:
        prepare_scratch_root(foreign)
    assert caught.value.type == "sandbox_scratch_root"
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ScratchRootError, match="not a directory"):
        prepare_scratch_root(link)
    with pytest.raises(ScratchRootError):
        ProcessSandbox(scratch_root=foreign, forkserver=False, warm=0)


def test_the_sandbox_reports_every_layer_and_keeps_no_capability(box: ProcessSandbox) -> None:
    result = call(box, "ok")
    iso = result.isolation
    assert iso["scratch"] == "own-mount" and iso["pid"] == "pidns" and iso["network"] in {"netns", "userns+netns"}
    assert iso["caps"] == "none"
    assert iso["filesystem"].startswith("landlock")
    assert iso["sockets"] == "seccomp"
    assert result.result["cwd"] == str(box.scratch_root)  # the call's own dir, mounted over the root
    if ROOT_USER:
        assert iso["uid"].isdigit() and iso["processes"].endswith("(own uid)")


def test_the_tool_module_path_never_holds_the_scratch_root_or_a_working_directory(box: ProcessSandbox) -> None:
    seen = call(box, "sys_path").result
    assert seen["cwd"] == str(box.scratch_root)
    assert not [p for p in seen["sys_path"] if p in ("", "/", seen["cwd"]) or p.startswith(str(box.scratch_root))]
    assert str(REPO) in seen["sys_path"]  # the worker's module search path, passed on
    cmdline = call(box, "list_scratch_root", target="/proc/self/cmdline").result["target"]
    assert "\x00-P\x00" in cmdline or sys.version_info < (3, 11)  # no working directory first on sys.path
    listing = call(box, "list_scratch_root").result
    assert isinstance(listing["parent_listing"], str) and "Permission" in listing["parent_listing"]


def test_one_call_cannot_read_another_calls_concurrent_scratch_file(box: ProcessSandbox) -> None:
    other = ProcessSandbox(preload=PRELOAD)  # another worker process of the same host and uid
    secret = f"tenant-b-secret-{os.getpid()}"
    outcome: dict = {}

    def tenant_b() -> None:
        outcome["b"] = call(other, "keep_secret", target=secret, amount=3, call_id="b")

    thread = threading.Thread(target=tenant_b)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        planted: list[Path] = []
        while time.monotonic() < deadline and not planted:
            planted = list(box.scratch_root.glob("escape-*/secret.txt"))
            time.sleep(0.05)
        assert planted, "tenant B's call never wrote its file"
        seen = call(box, "list_scratch_root", target=str(planted[0]), call_id="a").result
    finally:
        thread.join(timeout=20)
        other.close()
    assert secret not in json.dumps(seen)
    assert seen["target"].startswith(("FileNotFoundError", "PermissionError")), seen
    assert outcome["b"].result["cwd"] == str(other.scratch_root)


# ----------------------------------------------------------------- the result channel


@pytest.mark.parametrize(("mode", "amount", "says"), [
    ("forge_result", 0, "not JSON"),
    ("non_object", 0, "a JSON object"),
    ("deep_result", 100_000, "nests too deeply"),
    ("deep_result", MAX_RESULT_DEPTH + 5, f"deeper than {MAX_RESULT_DEPTH}"),
    ("huge_result", 50_000_000, f"exceeds {MAX_RESULT_BYTES} bytes"),
])
def test_malformed_results_are_typed_errors(box: ProcessSandbox, mode: str, amount: int, says: str) -> None:
    error = failure(box, mode, amount=amount)
    assert error.type == "tool_output_invalid", error.to_dict()
    assert says in str(error)
    assert call(box, "ok").result["ok"] is True


def test_a_forged_result_on_stdout_or_a_descriptor_is_never_taken(box: ProcessSandbox) -> None:
    error = failure(box, "forge_result", target='{"ok": true, "result": {"forged": true}}')
    assert error.type == "tool_output_invalid"  # its own answer pipe got garbage: refused, not believed
    assert "forged" not in json.dumps(error.details)


def test_a_recursion_error_in_the_tool_is_a_typed_error(box: ProcessSandbox) -> None:
    error = failure(box, "recursion")
    assert error.type == "tool_error" and "RecursionError" in str(error)


def test_unix_sockets_are_refused_to_non_networked_tools(box: ProcessSandbox, redis_url: str, tmp_path: Path) -> None:
    import socket

    path = str(tmp_path / "service.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    os.chmod(tmp_path, 0o755)
    os.chmod(path, 0o777)
    try:
        error = failure(box, "unix_socket", target=path)
    finally:
        server.close()
    assert error.type == "sandbox_denied", error.to_dict()


def test_output_is_read_with_a_cap_and_counted(box: ProcessSandbox) -> None:
    result = call(box, "flood_stdout", amount=50)
    assert result.result == {"printed_mb": 50}
    assert result.output["stdout"]["bytes"] == 50 * 1024 * 1024
    assert result.output["stdout"]["dropped_bytes"] >= 50 * 1024 * 1024 - 256_000


# ----------------------------------------------------------------- through a real worker


def enqueue_on(broker_url: str):  # noqa: ANN201 - the API's ``enqueue`` hook
    """Queue a job's decide step on ``broker_url`` (the process-wide Celery app talks to the session's Redis)."""
    from celery import Celery

    from toolrail.context import CELERY_REQUEST_ID_HEADER

    app = Celery("toolrail-test-enqueue", broker=broker_url)

    def enqueue(job) -> None:  # noqa: ANN001
        app.send_task("toolrail.decide", args=[job.job_id], queue="decide",
                      headers={CELERY_REQUEST_ID_HEADER: job.request_id})

    return enqueue


@pytest.fixture(scope="module")
def hostile_stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from toolrail.settings import get_settings

    redis_url = own_database(f"{__name__}:workers")
    registry = load_registry(modules=["tests.chaos.hostile_tools"])
    log_file = tmp_path_factory.mktemp("hostile-worker") / "worker.log"
    worker = start_worker(redis_url, queues=["decide", "tool.escape"], concurrency=1, log_file=log_file,
                          env={"TOOLRAIL_DECIDER": "none", "TOOLRAIL_TOOL_MODULES": "tests.chaos.hostile_tools",
                               "TOOLRAIL_LOG_JSON": "1"}, hostname="toolrail-hostile@%h")
    try:
        wait_for_workers(redis_url, count=1, timeout_s=90)
        runtime = Runtime.from_settings(get_settings(), redis_url=redis_url)
        runtime.registry = registry
        with api_server(create_app(get_settings(), runtime, mount_openai=False,
                                   enqueue=enqueue_on(redis_url))) as base:
            yield {"url": base, "worker": worker, "log": log_file}
    finally:
        stop_process(worker)


def escape_job(stack: dict, mode: str, **arguments) -> dict:
    with httpx.Client(base_url=stack["url"], timeout=30) as client:
        response = client.post("/v1/jobs", json={"tools": ["escape"], "tool_calls": [
            {"name": "escape", "arguments": {"mode": mode, **arguments}}]})
        assert response.status_code == 202, response.text
        return wait_for_job(client, response.json()["job_id"], timeout_s=60)


@pytest.mark.parametrize(("mode", "amount"), [("forge_result", 0), ("non_object", 0), ("deep_result", 100_000),
                                              ("huge_result", 50_000_000)])
def test_malformed_results_end_the_job_with_a_typed_error(hostile_stack: dict, mode: str, amount: int) -> None:
    job = escape_job(hostile_stack, mode, amount=amount)
    assert job["status"] == "failed", job
    assert job["calls"][0]["status"] == "failed"
    assert job["calls"][0]["error"]["type"] == "tool_output_invalid", job["calls"][0]["error"]
    assert hostile_stack["worker"].poll() is None


def _pool_processes(worker_pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{worker_pid}/task"):
        with open(f"/proc/{worker_pid}/task/{tid}/children") as fh:
            out += [int(p) for p in fh.read().split()]
    return out


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_300_mb_of_output_keeps_the_worker_under_its_memory_bound(hostile_stack: dict) -> None:
    job = escape_job(hostile_stack, "flood_stdout", amount=300)
    assert job["status"] == "succeeded", job
    worker_pid = hostile_stack["worker"].pid
    peaks = {pid: _peak_rss_mb(pid) for pid in [worker_pid, *_pool_processes(worker_pid)]}
    print(f"peak RSS MB after 300 MB of output: {peaks}")
    assert max(peaks.values()) < WORKER_MEMORY_BOUND_MB, peaks


def test_tool_output_becomes_bounded_log_events_with_the_call_id(hostile_stack: dict) -> None:
    job = escape_job(hostile_stack, "print_lines", target="hello", amount=150)
    assert job["status"] == "succeeded", job
    call_id = job["calls"][0]["id"]
    deadline = time.monotonic() + 10
    events: list[dict] = []
    while time.monotonic() < deadline:
        events = [json.loads(line) for line in hostile_stack["log"].read_text().splitlines() if line.startswith("{")]
        events = [e for e in events if e.get("call_id") == call_id and e.get("event", "").startswith("tool.output")]
        if any(e["event"] == "tool.output_truncated" for e in events):
            break
        time.sleep(0.2)
    lines = [e for e in events if e["event"] == "tool.output"]
    assert len(lines) == 200  # 300 lines printed, 200 logged: 100 of each stream
    assert sum(e["stream"] == "stderr" for e in lines) == 100
    assert lines[0]["line"] == "hello line 0" and lines[0]["job_id"] == job["job_id"]
    truncated = {e["stream"]: e for e in events if e["event"] == "tool.output_truncated"}
    assert {s: e["lines_not_logged"] for s, e in truncated.items()} == {"stdout": 50, "stderr": 50}


# ----------------------------------------------------------------- a non-root worker

NON_ROOT_UID = 10001
NON_ROOT_PROBE = textwrap.dedent('''
    import json, sys, time
    sys.path.insert(0, {repo!r})
    from executor.errors import SandboxError
    from executor.sandbox.boundary import CallRun
    from executor.sandbox.process import ProcessSandbox
    from tests.chaos.hostile_tools import ESCAPE_SPEC

    box = ProcessSandbox(preload="tools.builtin,tests.chaos.hostile_tools")
    out = {{}}
    for mode, target in (("ok", ""), ("fork_bomb", ""), ("ok", ""), ("read_file", "/etc/shadow"), ("leave_child", ""),
                         ("ipc_put", "secret"), ("ipc_get", "")):
        started = time.monotonic()
        try:
            result = box.run(ESCAPE_SPEC, CallRun("r", "j", mode, "k", {{"mode": mode, "target": target}}))
            out[mode] = {{"result": result.result, "isolation": result.isolation}}
        except SandboxError as exc:
            out[mode] = {{"error": exc.type, "message": str(exc)}}
        out[mode]["seconds"] = round(time.monotonic() - started, 3)
    box.close()
    print(json.dumps(out))
''')
AS_USER = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, {repo!r})
    from executor.sandbox.linux import make_reachable, private_mounts
    private_mounts()  # the interpreter may live under /root: reachable in this namespace only
    make_reachable([sys.base_prefix, sys.prefix, {repo!r}, sys.argv[1]])
    os.setgroups([])
    os.setresgid({uid}, {uid}, {uid})
    os.setresuid({uid}, {uid}, {uid})
    os.execv(sys.executable, [sys.executable, sys.argv[1]])
''')


def test_a_fork_bomb_under_a_non_root_worker_hits_the_per_call_process_limit(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(NON_ROOT_PROBE.format(repo=str(REPO)))
    probe.chmod(0o644)
    tmp_path.chmod(0o755)
    if ROOT_USER:  # become the shipped image's worker: an unprivileged uid without any capability
        launcher = tmp_path / "as_user.py"
        launcher.write_text(AS_USER.format(repo=str(REPO), uid=NON_ROOT_UID))
        argv = [sys.executable, str(launcher), str(probe)]
    else:
        argv = [sys.executable, str(probe)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir(), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    iso = out["ok"]["isolation"]
    if iso.get("userns") != "userns":
        pytest.skip(f"no user namespace for a non-root worker here: {iso.get('userns')}")
    assert out["ok"]["result"]["uid"] == (NON_ROOT_UID if ROOT_USER else os.geteuid())
    assert iso["processes"] == "32 per call (user namespace)" and iso["pid"] == "pidns"
    assert iso["caps"] == "none" and iso["sockets"] == "seccomp"
    print(f"non-root fork bomb: {out['fork_bomb']}")
    assert out["fork_bomb"]["error"] == "tool_process_limit", out["fork_bomb"]
    assert out["fork_bomb"]["seconds"] < ESCAPE_SPEC.timeout_s
    assert out["ok"]["result"]["ok"] is True  # the next call of the same worker is unaffected
    assert out["read_file"]["error"] == "sandbox_denied"
    # what a call leaves is counted and killed, and nothing of one call's IPC reaches the next, here too
    assert out["leave_child"]["error"] == "tool_left_process", out["leave_child"]
    assert out["ipc_put"]["result"] == {"left": True} and "error" in out["ipc_get"], out["ipc_get"]
