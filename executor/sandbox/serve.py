"""The call parent as a process: ``python -m executor.sandbox.serve --forkserver FD`` is the fork server
(``serve_forks``: it imports the tool modules once, then serves the worker's calls one at a time through
``executor.sandbox.parent.run_call``); without ``--forkserver``, one spawned call parent (``main``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
from typing import Any

from executor.sandbox import child, linux, parent, prepared
from executor.sandbox.answer import error_frame
from executor.sandbox.linux import close_all, libc, reap_children

__all__ = ["entry", "main", "serve_forks"]


class _Lines:
    """Lines (and the descriptors sent with them) from the worker's socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def line(self) -> tuple[str, list[int]]:
        fds: list[int] = []
        while b"\n" not in self.buffer:
            message, got, _flags, _addr = socket.recv_fds(self.sock, 65536, 4)
            fds.extend(got)
            if not message:
                raise EOFError
            self.buffer += message
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode(errors="replace"), fds

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            chunk = self.sock.recv(max(65536, size - len(self.buffer)))
            if not chunk:
                raise EOFError
            self.buffer += chunk
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data


def serve_forks(sock_fd: int) -> int:
    """Fork server ("zygote"): import once, then serve one call at a time for one worker process.

    Protocol on the Unix socket shared with the worker process: ``call <n>`` with four fds (the
    call's stdout, stderr, result and progress pipes), then the ``n``-byte JSON request; we answer
    ``pid <pid> <how>`` once the tool process exists (``how``: ``ask`` — send ``kill`` to end the
    call; ``group`` — kill that process group yourself), write the result frame on the result
    pipe, and answer ``exit <pid> <status>``. A ``kill`` that arrives once a call is over is ignored.

    As root with per-call uids, the server first makes the interpreter and the tool packages
    reachable for an unprivileged uid in a mount namespace of its own (``make_reachable``), so
    that no tool process needs a capability to import.
    """
    linux.die_with_parent()
    linux.name_process(b"tr-forkserver")
    libc.prctl(linux.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # what a call parent leaves (its init) is reaped here
    modules = child.preload_modules()
    child.reachable_for_own_uid(modules)
    child.configure_tool_logging()
    # every call's confinement looks this up: computed here once, inherited by each fork
    read = child.read_paths(modules, exclude=[os.environ.get("TOOLRAIL_SANDBOX_SCRATCH_ROOT", "")])
    os.set_inheritable(sock_fd, False)  # no call's process (the init is exec'd) may hold the worker's socket
    sock = socket.socket(fileno=sock_fd)
    reuse = os.environ.get("TOOLRAIL_SANDBOX_PARENT_PER_CALL") != "1" and parent.own_pid_namespace_for_children(sock)
    # made once here, used by every call's tool process: its Landlock rules' paths, the seccomp program, and the
    # empty network namespace (in this server's user namespace, where a non-root one has its own)
    prepared.prepare_confinement(read)
    prepared.prepare_empty_network()
    lines = _Lines(sock)
    while True:
        try:
            line, fds = lines.line()
        except (OSError, EOFError):
            return 0
        kind, _, size = line.partition(" ")
        if kind != "call" or len(fds) != 4:
            close_all(fds)
            if kind == "kill":
                continue  # a timeout that crossed the call's end
            return 0
        try:
            request = json.loads(lines.exactly(int(size)))
        except (OSError, EOFError, ValueError):
            close_all(fds)
            return 0
        try:
            _serve_one(sock, request, modules, fds, reuse=reuse)
        except OSError:
            return 0
        reap_children()


def _serve_one(sock: socket.socket, request: dict, modules: list[str], fds: list[int], *, reuse: bool) -> None:
    stdout, stderr, result, progress = fds
    if reuse:
        announced: list[int] = []

        def started(host: int) -> None:
            announced.append(host)
            with contextlib.suppress(OSError):  # the worker is gone: its socket's EOF ends the call (``_read_answer``)
                sock.sendall(f"pid {host} ask\n".encode())

        frame, status, pid = _safe_call(request, modules, stdio=(stdout, stderr, progress), session=True, control=sock,
                                        on_tool=started)
        if not announced:  # it failed before a tool process existed: the worker still waits for a pid
            close_all((stdout, stderr, progress))
            sock.sendall(b"pid 0 ask\n")
        _write_frame(result, frame)
        os.close(result)
        sock.sendall(f"exit {pid} {status}\n".encode())
        return
    parent = os.fork()  # no PID namespace of our own to come back to: one call parent per call
    if parent == 0:
        code = 1
        try:
            sock.close()
            os.setsid()
            frame, _status, _pid = _safe_call(request, modules, stdio=(stdout, stderr, progress))
            _write_frame(result, frame)
            code = 0
        finally:
            os._exit(code)
    close_all(fds)
    sock.sendall(f"pid {parent} group\n".encode())
    _, status = os.waitpid(parent, 0)
    sock.sendall(f"exit {parent} {status}\n".encode())


def _safe_call(request: dict, modules: list[str], **kwargs: Any) -> tuple[dict, int, int]:
    try:
        return parent.traced_run_call(request, modules, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the call parent's own failure is a typed sandbox error
        return error_frame("sandbox_error", f"sandbox setup failed: {type(exc).__name__}: {exc}"), 0, 0


def _write_frame(fd: int, frame: dict) -> None:
    with contextlib.suppress(OSError):  # the worker stopped reading (its timeout): nothing to tell
        child.write_all(fd, json.dumps(frame, ensure_ascii=False).encode())


# ----------------------------------------------------------------- a spawned call parent


def main(argv: list[str]) -> int:
    """A spawned call parent (no fork server): fds 0-2 and 4 are the call's, the result pipe is fd 3."""
    result_fd = int(argv[argv.index("--result-fd") + 1]) if "--result-fd" in argv else child.RESULT_FD
    progress_fd = int(argv[argv.index("--progress-fd") + 1]) if "--progress-fd" in argv else child.PROGRESS_FD
    if progress_fd == child.RESULT_FD != result_fd:
        progress_fd = os.dup(progress_fd)  # out of the way of the result pipe's dup2
    if result_fd != child.RESULT_FD:
        os.dup2(result_fd, child.RESULT_FD)
        os.close(result_fd)
    if progress_fd != child.PROGRESS_FD:
        os.dup2(progress_fd, child.PROGRESS_FD)
        os.close(progress_fd)
    try:  # checked before this process opens any pipe of its own: a pipe at child.PROGRESS_FD now is the call's
        child.mark_progress_pipe(stat.S_ISFIFO(os.fstat(child.PROGRESS_FD).st_mode))
    except OSError:
        child.mark_progress_pipe(False)
    linux.name_process(b"tr-call-parent")
    linux.die_with_parent()
    libc.prctl(linux.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # the tool's orphans come back to us, to be found
    libc.prctl(linux.PR_SET_DUMPABLE, 0, 0, 0, 0)  # no process of the worker's uid may open our fds via /proc
    modules = child.preload_modules()
    child.reachable_for_own_uid(modules)
    line = sys.stdin.readline()
    if not line:
        return 0
    request = json.loads(line)
    _write_frame(child.RESULT_FD, _safe_call(request, modules)[0])
    os._exit(0)


def entry(argv: list[str]) -> int:
    """``python -m executor.sandbox.serve [--forkserver FD]``: a fork server, or one spawned call parent."""
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]  # ``python -m`` put it first (no ``-P`` < 3.11)
    if len(argv) > 2 and argv[1] == "--forkserver":
        return serve_forks(int(argv[2]))
    return main(argv)


if __name__ == "__main__":
    # run as the package's module, not as ``__main__``: one copy of this module's state
    from executor.sandbox import serve as _module  # noqa: PLW0406 - the package's module, not this __main__ copy

    sys.exit(_module.entry(sys.argv))
