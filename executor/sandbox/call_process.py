"""The worker's handle on a call's process, and ending it.

By default the worker's fork server (``ForkServer``: ``python -m executor.sandbox.serve --forkserver FD``) is the
parent of every call; without it each call spawns a call parent of its own (``spawn_call_parent``). Either way
the sandbox holds a ``CallProcess``: ``Popen``'s surface and the parent's ends of the call's pipes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from executor.sandbox.linux import close_all


__all__ = ["CallProcess", "ForkServer", "ForkedCall", "end_call", "kill_group", "kill_uid", "spawn_call_parent"]


@dataclass
class CallProcess:
    """The worker's handle on one call's process and the parent's ends of its pipes."""

    proc: Any  # subprocess.Popen, or ForkedCall from the fork server: same surface
    #: The parent's ends of the call's pipes: stdin (write), stdout, stderr, result (read).
    fds: dict[str, int] = field(default_factory=dict)

    def release(self) -> None:
        """Close the parent's ends of the call's pipes."""
        close_all(self.fds.values())
        self.fds = {}


class ForkedCall:
    """A call served by the fork server, with the parts of ``Popen`` the sandbox uses.

    ``pid`` is the tool process (the fork server is the call's parent) or, where the server
    forks a call parent per call, that parent. ``how`` says how a timeout ends the call:
    ``ask`` the server (it owns the pids: no race with their reuse), or kill the ``group``.
    """

    def __init__(self, server: ForkServer, pid: int, how: str) -> None:
        self._server = server
        self.pid = pid
        self.how = how
        self.returncode: int | None = None

    def kill(self) -> None:
        if self.returncode is None:
            self._server.ask_kill()

    def abandon(self) -> None:
        """The server never reported this call's end: close it (and what it runs); the next call starts another."""
        self._server.close()

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.wait_exit(self.pid, timeout=timeout)
        return self.returncode


class ForkServer:
    """The worker's end of its fork server: a pre-imported ``python -m executor.sandbox.serve --forkserver``."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._buffer = b""
        self.proc = subprocess.Popen([*python_argv(python), "executor.sandbox.serve", "--forkserver", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env, cwd="/", start_new_session=True)
        theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _line(self, timeout: float | None) -> str:
        self._sock.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(256)
            if not chunk:
                raise ConnectionError("the fork server went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def fork(self, request: bytes, *, timeout: float = 30.0) -> CallProcess:
        """Hand the server one call (its pipes and request); returns once the call's process exists."""
        pipes = {"stdout": os.pipe(), "stderr": os.pipe(), "result": os.pipe(), "progress": os.pipe()}
        theirs = [pipes["stdout"][1], pipes["stderr"][1], pipes["result"][1], pipes["progress"][1]]
        ours = {name: pair[0] for name, pair in pipes.items()}
        try:
            self._sock.settimeout(timeout)
            socket.send_fds(self._sock, [f"call {len(request)}\n".encode()], theirs)
            self._sock.sendall(request)
        except OSError:
            close_all(ours.values())
            raise
        finally:
            close_all(theirs)
        try:
            kind, pid, how = self._line(timeout).split()[:3]
            if kind != "pid":
                raise ConnectionError(f"unexpected fork server reply {kind!r}")
        except (OSError, ValueError):
            close_all(ours.values())
            raise
        return CallProcess(ForkedCall(self, int(pid), how), ours)

    def ask_kill(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(b"kill\n")

    def wait_exit(self, pid: int, *, timeout: float | None) -> int | None:
        try:
            kind, got, status = self._line(timeout).split()[:3]
        except (OSError, ValueError):
            return None
        if kind != "exit" or int(got) != pid:
            return None
        return os.waitstatus_to_exitcode(int(status))

    def close(self) -> None:
        try:
            self._sock.close()
        finally:
            kill_group(self.proc)


def python_argv(python: str) -> list[str]:
    """``python -m``, without the working directory first on ``sys.path`` where Python has ``-P`` (3.11+)."""
    return [python, "-P", "-m"] if sys.version_info >= (3, 11) else [python, "-m"]


def spawn_call_parent(python: str, env: dict[str, str]) -> CallProcess:
    """A spawned call parent (``python -m executor.sandbox.serve``) for one call: its stdio and pipes are the call's."""
    pipes = {"stdin": os.pipe(), "stdout": os.pipe(), "stderr": os.pipe(), "result": os.pipe(),
             "progress": os.pipe()}
    result_w, progress_w = pipes["result"][1], pipes["progress"][1]
    theirs = [pipes["stdin"][0], pipes["stdout"][1], pipes["stderr"][1], result_w, progress_w]
    ours = {"stdin": pipes["stdin"][1], "stdout": pipes["stdout"][0], "stderr": pipes["stderr"][0],
            "result": pipes["result"][0], "progress": pipes["progress"][0]}
    try:
        proc = subprocess.Popen(
            [*python_argv(python), "executor.sandbox.serve", "--result-fd", str(result_w),
             "--progress-fd", str(progress_w)],
            stdin=theirs[0], stdout=theirs[1], stderr=theirs[2], pass_fds=[result_w, progress_w],
            env=env, cwd="/", start_new_session=True, close_fds=True,
        )
    except OSError:
        close_all(ours.values())
        raise
    finally:
        close_all(theirs)
    return CallProcess(proc, ours)


def end_call(proc: Any, *, kill: bool = False) -> None:
    """After a call: wait for its end, ending it first when ``kill`` (a timeout, or a failure reading it).

    A fork server that does not report the call's end within 5 s is out of step with this
    worker: it is closed (killing what it runs) and the next call starts a fresh one.
    """
    if not (isinstance(proc, ForkedCall) and proc.how == "ask"):
        kill_group(proc)
        return
    if kill:
        proc.kill()
    if proc.wait(timeout=5) is None and not kill:
        proc.kill()
        proc.wait(timeout=5)
    if proc.returncode is None:
        proc.abandon()


def kill_group(proc: Any) -> None:
    """SIGKILL the process group ``proc`` leads, and wait (5 s at most) for its end."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def kill_uid(uid: int) -> None:
    """SIGKILL every process running as ``uid`` (a call's own uid: only its processes)."""
    for _ in range(5):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid != uid:
                    continue
                os.kill(int(entry), signal.SIGKILL)
                found = True
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.01)
