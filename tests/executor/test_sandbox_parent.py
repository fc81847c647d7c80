"""The fork server as every call's parent: timeouts, leftovers, its own death, and the per-call-parent mode.

Real processes throughout (``ProcessSandbox`` with its fork server); the hostile tools of
``tests.chaos.hostile_tools`` play the tool.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from executor.errors import SandboxError, ToolTimeoutError
from executor.sandbox.boundary import CallRun
from executor.sandbox.process import ProcessSandbox
from tests.chaos.hostile_tools import ESCAPE_SPEC

PRELOAD = "tools.builtin,tests.chaos.hostile_tools"
SHORT = ESCAPE_SPEC.model_copy(update={"timeout_s": 1.0})


def run(box: ProcessSandbox, mode: str, *, spec=ESCAPE_SPEC, amount: int = 0, call_id: str = "c"):
    return box.run(spec, CallRun(request_id="req-parent", job_id="job-parent", call_id=call_id, idempotency_key="k",
                                 arguments={"mode": mode, "amount": amount}))


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from ``/proc``)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = [int(p) for p in Path(f"/proc/{current}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            todo.extend(children)
    return [p for p in found if alive(p)]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def forkserver_pid(box: ProcessSandbox) -> int:
    """The serving fork server: the handle's child where the server made itself PID 1 of its own namespace."""
    handle = box._forkserver.proc.pid
    children = Path(f"/proc/{handle}/task/{handle}/children").read_text().split()
    return int(children[0]) if children else handle


def call_processes(box: ProcessSandbox) -> list[int]:
    """Processes of calls (tool, init, a per-call parent) under the fork server: none between calls."""
    server = forkserver_pid(box)
    return [p for p in descendants(box._forkserver.proc.pid) if p != server]


@pytest.fixture(params=[False, True], ids=["server-is-parent", "parent-per-call"])
def box(request: pytest.FixtureRequest):
    sandbox = ProcessSandbox(preload=PRELOAD, parent_per_call=request.param)
    yield sandbox
    sandbox.close()


def test_a_timed_out_call_ends_with_everything_it_started_and_the_next_call_runs(box: ProcessSandbox) -> None:
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError):
        run(box, "sleep", spec=SHORT, amount=60)
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert call_processes(box) == []
    result = run(box, "ok", call_id="after")
    assert result.isolation["pid"] == "pidns" and result.isolation["ipc"] == "ipcns"


def test_leftovers_are_counted_and_killed_in_both_modes(box: ProcessSandbox) -> None:
    with pytest.raises(SandboxError) as caught:
        run(box, "leave_child")
    assert caught.value.type == "tool_left_process"
    assert run(box, "ok", call_id="after").result


def test_each_call_gets_its_own_pid_namespace(box: ProcessSandbox) -> None:
    first, second = run(box, "ok", call_id="one"), run(box, "ok", call_id="two")
    namespaces = {first.result.get("pid_ns"), second.result.get("pid_ns")} - {None}
    assert first.isolation["pid"] == second.isolation["pid"] == "pidns"
    if namespaces:  # the tool reports its namespace where it can read it
        assert len(namespaces) == 2


def test_a_dying_fork_server_takes_its_call_with_it_and_is_replaced() -> None:
    box = ProcessSandbox(preload=PRELOAD)
    try:
        run(box, "ok", call_id="warm")
        errors: list[BaseException] = []

        def long_call() -> None:
            try:
                run(box, "sleep", amount=30, call_id="long")
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        thread = threading.Thread(target=long_call)
        thread.start()
        deadline = time.monotonic() + 5
        while len(call_processes(box)) < 2 and time.monotonic() < deadline:  # the tool and the call's init
            time.sleep(0.05)
        running = call_processes(box)
        assert len(running) >= 2, "the long call never started"
        os.kill(forkserver_pid(box), signal.SIGKILL)
        thread.join(timeout=20)
        assert not thread.is_alive()
        assert errors and isinstance(errors[0], SandboxError), errors
        time.sleep(0.2)
        assert [p for p in running if alive(p)] == []  # they died with the server's PID namespace
        assert run(box, "ok", call_id="next").result  # a new server serves the next call
    finally:
        box.close()


def test_a_failure_reading_a_call_ends_it_and_the_server_stays_in_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a timeout: reading the call's pipes fails. The call is ended all the same (nothing of it lives on) and the
    next call gets a server in step with this worker (the same one, or a fresh one)."""
    import executor.sandbox.process as sandbox_module

    box = ProcessSandbox(preload=PRELOAD)
    real_collect = sandbox_module.collect

    def failing_collect(*args, **kwargs):
        time.sleep(0.3)  # the tool is running by now
        raise RuntimeError("reading the call failed")

    try:
        monkeypatch.setattr(sandbox_module, "collect", failing_collect)
        with pytest.raises(SandboxError):
            run(box, "sleep", amount=30, call_id="broken")
        monkeypatch.setattr(sandbox_module, "collect", real_collect)
        time.sleep(0.2)
        assert box._forkserver is None or call_processes(box) == []
        assert run(box, "ok", call_id="next").result
    finally:
        box.close()
