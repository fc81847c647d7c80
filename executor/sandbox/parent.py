"""The trusted side of a sandboxed call: the process that starts the tool, reads its answer and writes the result.

One call, two processes of the tool's own: the **tool process** (``executor.sandbox.child.tool_process``:
its namespaces, uid, limits, confinement, then the tool) and the call's **init**, PID 1 of the
call's PID namespace — ``sleep`` started with ``posix_spawn`` (no copy of this interpreter), to
which whatever the tool leaves behind is reparented, so it is counted and dies with the init.

The **call parent** (``run_call``) never runs tool code: it starts both, reads the tool's
answer from a pipe of its own with a cap, sees the tool's exit on a pidfd, counts and kills
what is left, and builds the one result frame the worker reads. It is either

- the **fork server** itself (``executor.sandbox.serve.serve_forks``): one per worker process, serving one call at a
  time, so a call costs one fork of the pre-imported interpreter (the tool process) and a
  ``posix_spawn`` (the init). To give every call a PID namespace of its own it re-enters its own
  PID namespace for its children after each call (``setns``); a non-root fork server first makes
  itself PID 1 of a user and PID namespace of its own so that it may. Where that is not possible
  it forks a call parent per call, as a spawned one is;
- or a spawned ``python -m executor.sandbox.serve`` (the fallback without a fork server): one
  call, its stdio the call's.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import time
from typing import Any

from executor.sandbox import child, linux, prepared
from executor.sandbox.answer import (MAX_FRAME_BYTES, MAX_RESULT_BYTES, OutputError, checked_answer, decode_object,
                                     error_frame)
from executor.sandbox.linux import (CLONE_NEWPID, children, close_all, host_pid, kill_leftovers, libc, live_pids,
                                    new_pid_namespace)
from toolrail.span_data import ChildRecorder  # a traced call's span, as plain data: no tracer provider, no thread

__all__ = ["own_pid_namespace_for_children", "run_call", "start_init", "traced_run_call"]

#: The program that holds a call's PID namespace open as its PID 1 (it only waits: the call parent ends it).
INIT_PROGRAM = ("sleep", "/bin/sleep", "/usr/bin/sleep")
#: This process's own PID namespace, re-entered for its children after each call (fork server).
_own_pid_ns: int | None = None
#: Whether that namespace is the server's own (its pids differ from the host's, which ``/proc`` shows).
_private_pid_ns = False
#: Whether this process entered a user namespace of its own (a non-root call parent needs one for PID namespaces).
_own_userns = False
_exit_statuses: dict[int, int] = {}


# ----------------------------------------------------------------- one call


def run_call(request: dict, modules: list[str], *, stdio: tuple[int, int, int | None] | None = None,
             session: bool = False, control: socket.socket | None = None,
             on_tool: Any = None) -> tuple[dict, int, int]:
    """Start the call's init and tool process, read the answer, build the result frame.

    ``stdio``: the call's stdout, stderr and progress pipes when they are not this process's
    fds 1, 2 and 4 (the fork server's case: it closes its copies once the tool has them).
    ``session``: the tool leads a session of its own (the fork server must outlive any kill).
    ``control``: a socket on which ``kill`` ends the call early (the worker's timeout).
    ``on_tool(pid)``: called once the tool process exists, with its pid as the host sees it.
    Returns the frame, the tool's wait status and its host pid.
    """
    isolation: dict[str, str] = {}
    if os.geteuid() != 0 and not _own_userns:
        isolation["parent_userns"] = linux.enter_user_namespace()
    isolation["pid"] = new_pid_namespace()
    pid_namespace = isolation["pid"] == "pidns"
    init = start_init(int(request.get("timeout_s") or 60) + 60) if pid_namespace else None
    try:
        answer_r, answer_w = os.pipe()
        tool = os.fork()
        if tool == 0:
            try:
                os.close(answer_r)
                if session:
                    os.setsid()
                if stdio is not None:
                    answer_w = _as_call_stdio(stdio, answer_w)
                child.tool_process(request, answer_w, modules)
            finally:
                os._exit(1)
        os.close(answer_w)
        if stdio is not None:
            close_all(fd for fd in stdio if fd is not None)
        else:
            _stdio_to_devnull()  # only the tool holds the call's stdout and stderr: their EOF is its exit
        if pid_namespace and _own_pid_ns is not None:
            _leave_call_pid_namespace()
        tool_fd = _pidfd(tool)  # one pidfd: the tool's host pid, then its exit
        try:
            tool_pid = _host_pid_of(tool, tool_fd)
            if on_tool is not None:
                on_tool(tool_pid)
            data, too_big = _read_answer(answer_r, tool, tool_fd, limit=MAX_FRAME_BYTES, control=control,
                                         kill=lambda: _kill_call(tool, init, session=session))
        finally:
            if tool_fd is not None:
                os.close(tool_fd)
        os.close(answer_r)
        if too_big:
            os.kill(tool, signal.SIGKILL)  # the answer is refused whole: stop the writer
        status = _wait_status(tool)
        if init is not None:  # what the tool left was reparented to the init: count it, then end it all at once
            # nothing of the call's can leave its PID namespace: no uid sweep. /proc is the host's: its pids
            init_fd = _pidfd(init)
            left = len(live_pids(children(_host_pid_of(init, init_fd))))
            if init_fd is not None:
                os.close(init_fd)
            _end_init(init)  # the kernel has killed and reaped everything in the namespace once this returns
        else:
            left = kill_leftovers(child.SANDBOX_UID_BASE + tool_pid if request.get("own_uid") and os.geteuid() == 0
                                  else None)  # the uid the tool process gave itself (``tool_namespaces``)
    except BaseException:  # the call parent failed mid-call: the call's namespace ends with it
        if init is not None:
            _end_init(init)
        raise
    return _frame(data, isolation, status=status, left=left, too_big=too_big), status, tool_pid


def _frame(data: bytes, isolation: dict[str, str], *, status: int, left: int, too_big: bool) -> dict:
    header, _, body = data.partition(b"\n")
    try:
        isolation.update(json.loads(header).get("isolation", {}) if header else {})
    except (ValueError, AttributeError):
        pass
    frame: dict[str, Any]
    if too_big:
        frame = error_frame("tool_output_invalid", f"the tool's result exceeds {MAX_RESULT_BYTES} bytes",
                       limit_bytes=MAX_RESULT_BYTES)
    elif not body:  # no answer: the worker names the death (it has the stderr)
        frame = {"ok": False, "exit": os.waitstatus_to_exitcode(status)}
    else:
        try:
            frame = checked_answer(decode_object(body, what="the tool's result"))
        except OutputError as exc:
            frame = error_frame("tool_output_invalid", str(exc))
    if left and (frame.get("ok") or frame.get("error", {}).get("type") == "tool_error"):
        frame = error_frame("tool_left_process", f"the tool left {left} process(es) running after it returned; "
                                            "they were killed", processes=left)
    frame["isolation"] = isolation
    frame["network"] = isolation.get("network", "")
    return frame


def traced_run_call(request: dict, modules: list[str], **kwargs: Any) -> tuple[dict, int, int]:
    """``run_call`` inside a ``sandbox {tool}`` span when the call carries a trace context.

    The span is recorded as plain data (``ChildRecorder``: no tracer provider, no thread) and
    rides back in the result frame (``spans``), which the worker hands to its own exporters. It
    is the call parent's, around the tool process's whole life; nothing the tool writes becomes a span.
    """
    if not request.get("trace_context"):
        return run_call(request, modules, **kwargs)
    try:
        recorder = ChildRecorder(request["trace_context"])
    except Exception:  # noqa: BLE001 - tracing never stops a call
        return run_call(request, modules, **kwargs)
    with recorder.span(f"sandbox {request.get('tool')}", **{"gen_ai.tool.call.id": request.get("call_id"),
                                                           "process.pid": host_pid()}) as span:
        frame, status, pid = run_call(request, modules, **kwargs)
        if span is not None:
            error = frame.get("error") if isinstance(frame.get("error"), dict) else {}
            span.set_attribute("toolrail.call.ok", bool(frame.get("ok")))
            if error.get("type") or "exit" in frame:
                span.set_attribute("error.type", str(error.get("type") or "tool_crashed"))
            for layer, value in (frame.get("isolation") or {}).items():
                span.set_attribute(f"toolrail.sandbox.{layer}", str(value))
    frame["spans"] = recorder.finished()
    return frame, status, pid


def _as_call_stdio(stdio: tuple[int, int, int | None], answer_fd: int) -> int:
    """In the tool process: the call's pipes at fds 1, 2 and 4 (``PROGRESS_FD``); returns the answer pipe's fd.

    Every source is first copied to 10 or above, so no target overwrites a source still needed;
    the tool process closes all the copies but the answer pipe's.
    """
    out, err, progress = stdio
    high = {name: fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for name, fd in
            (("out", out), ("err", err), ("progress", progress), ("answer", answer_fd)) if fd is not None}
    os.dup2(high["out"], 1)
    os.dup2(high["err"], 2)
    if "progress" in high:
        os.dup2(high["progress"], child.PROGRESS_FD)
    child.mark_progress_pipe("progress" in high)
    return high["answer"]


def _kill_call(tool: int, init: int | None, *, session: bool) -> None:
    """End the call now (the worker's timeout): the tool (and its session), and the whole PID namespace."""
    with contextlib.suppress(OSError):
        os.killpg(tool, signal.SIGKILL) if session else os.kill(tool, signal.SIGKILL)
    if init is not None:
        with contextlib.suppress(OSError):
            os.kill(init, signal.SIGKILL)


def _pidfd(pid: int) -> int | None:
    """A pidfd of child ``pid`` (None where the kernel has none: ``waitpid`` polling then sees its exit)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _host_pid_of(pid: int, pidfd: int | None) -> int:
    """A child's pid as the host's ``/proc`` sees it (a fork server in a PID namespace of its own knows another)."""
    if not _private_pid_ns or pidfd is None:
        return pid
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as fh:
            for line in fh:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pid


# ----------------------------------------------------------------- the call's init


def start_init(lifetime_s: int) -> int:
    """PID 1 of the call's PID namespace: a process that only waits, holding the namespace open.

    Every process the tool leaves behind is reparented to it, so the call parent counts them
    as its children, and killing it makes the kernel kill the rest. It runs no Python: in a fork
    server that is PID 1 of a namespace of its own (whose end ends every call's), a clone of this
    process sharing its memory that only waits (``prepared.clone_waiter``: no page table copied, no
    program started); else ``sleep`` started with ``posix_spawn`` (no copy of this interpreter's
    memory, stdio on ``/dev/null``, no descriptor of the call, an empty environment, a lifetime of
    its own), or, where no ``sleep`` exists, a fork of this process that pauses.
    """
    if _private_pid_ns and (waiter := prepared.clone_waiter()) is not None:
        return waiter
    program = next((path for path in INIT_PROGRAM[1:] if os.access(path, os.X_OK)), None)
    if program is not None:
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0), (os.POSIX_SPAWN_DUP2, 0, 1),
                   (os.POSIX_SPAWN_DUP2, 0, 2)]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in (child.RESULT_FD, child.PROGRESS_FD) if _is_open(fd)]
        with contextlib.suppress(OSError):
            return os.posix_spawn(program, [INIT_PROGRAM[0], str(max(1, lifetime_s))], {}, file_actions=actions)
    pid = os.fork()
    if pid == 0:
        try:
            linux.remember_parent()
            linux.die_with_parent()
            _stdio_to_devnull()
            os.closerange(3, 1 << 16)
            while True:
                signal.pause()
        finally:
            os._exit(0)
    return pid


def _end_init(init: int) -> None:
    """Kill the call's init (the kernel then kills the rest of its PID namespace) and wait for it: a cloned init's
    stack is the next call's."""
    with contextlib.suppress(OSError):
        os.kill(init, signal.SIGKILL)
    _wait_status(init)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# ----------------------------------------------------------------- reading the answer


def _read_answer(answer_fd: int, tool: int, exited_fd: int | None, *, limit: int,
                 control: socket.socket | None = None, kill: Any = None) -> tuple[bytes, bool]:
    """Read the tool's answer until the tool process has exited; ``(answer, too_big)``.

    The tool's exit is seen on its pidfd ``exited_fd`` (or by polling ``waitpid`` where the
    kernel has none), not on the pipe's EOF, which a leftover process holding the pipe could
    delay: what is still in the pipe then is drained without waiting. Never more than
    ``limit`` bytes. A ``kill`` line on ``control`` (the worker's timeout) ends the call at once.
    """
    data = bytearray()
    poller = select.poll()
    poller.register(answer_fd, select.POLLIN)
    if exited_fd is not None:
        poller.register(exited_fd, select.POLLIN)
    if control is not None:
        poller.register(control.fileno(), select.POLLIN)
    answer_open = True
    while True:
        ready = poller.poll(None if exited_fd is not None else 20)
        exited = any(fd == exited_fd for fd, _ in ready) or (exited_fd is None and _exited(tool))
        for fd, _ in ready:
            if control is not None and fd == control.fileno():
                control.recv(64)  # ``kill`` (the worker's timeout), or EOF (the worker is gone): end the call
                poller.unregister(fd)
                control = None
                if kill is not None:
                    kill()
                continue
            if fd != answer_fd:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(answer_fd)
                answer_open = False
                continue
            data += chunk
            if len(data) > limit:
                return bytes(data[:limit]), True
        if exited:
            if answer_open:
                os.set_blocking(answer_fd, False)
                with contextlib.suppress(BlockingIOError):
                    while chunk := os.read(answer_fd, 65536):
                        data += chunk
                        if len(data) > limit:
                            return bytes(data[:limit]), True
            return bytes(data), False
        if not answer_open and exited_fd is None:
            time.sleep(0.002)


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited (its status kept for ``_wait_status``)."""
    if pid in _exit_statuses:
        return True
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        _exit_statuses[pid] = 0
        return True
    if got == pid:
        _exit_statuses[pid] = status
        return True
    return False


def _wait_status(pid: int) -> int:
    if pid in _exit_statuses:
        return _exit_statuses.pop(pid)
    while True:
        try:
            got, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return 0
        if got == pid:
            return status


def _stdio_to_devnull() -> None:
    """Let go of the call's stdout and stderr (and stdin): the worker reads them until the tool's side closes."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


# ----------------------------------------------------------------- the fork server's PID namespace


def _leave_call_pid_namespace() -> None:
    """Children from now on are born in this process's own PID namespace again (the next call makes its own)."""
    global _own_pid_ns
    try:
        _setns(_own_pid_ns)
    except OSError:  # cannot happen once proven at start; if it does, later calls get no PID namespace (logged as such)
        os.close(_own_pid_ns)
        _own_pid_ns = None


def _setns(fd: int) -> None:
    if libc.setns(fd, CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "setns(CLONE_NEWPID)")


def own_pid_namespace_for_children(sock: socket.socket) -> bool:
    """Whether this process may give each call a fresh PID namespace and come back to its own after.

    The server makes itself PID 1 of a PID namespace of its own (a non-root one inside a user
    namespace of its own, where it has the capability to): it may re-enter that namespace for
    its children after each call (``setns``), and when it dies the kernel kills every call it
    still had, init and leftovers included. Its parent stays behind, waiting, as the worker's
    handle on the server. Where none of that is possible, it forks a call parent per call.
    """
    global _own_pid_ns, _private_pid_ns, _own_userns
    if os.geteuid() != 0:
        if linux.enter_user_namespace() != "userns":
            return False
        _own_userns = True
    if libc.unshare(CLONE_NEWPID) == 0:
        pid = os.fork()
        if pid != 0:  # the worker's handle: waits for the server, holding nothing of its
            sock.close()
            status = 1
            with contextlib.suppress(ChildProcessError):
                status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            os._exit(status if status >= 0 else 1)
        linux.remember_parent()
        linux.die_with_parent()
        _private_pid_ns = True
    elif os.geteuid() != 0:
        return False
    try:
        _own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        _setns(_own_pid_ns)  # proves that it may (it needs a capability over its own namespace)
    except OSError:
        if _own_pid_ns is not None:
            os.close(_own_pid_ns)
        _own_pid_ns = None
        return False
    return True
