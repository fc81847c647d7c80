"""What a fork server makes once for every call it serves: prepared Landlock rules, an empty network, an init.

Each piece takes a per-call cost off the tool process or the call parent and keeps the isolation the
per-call form gave (``bench/results/cost.md`` has the figures):

- ``prepare_confinement``: the paths of every call's Landlock read rules opened once (``O_PATH``), so a
  tool process adds each rule with one system call; the seccomp program and capability buffers built once;
- ``prepare_empty_network``: one empty network namespace that every confined, non-networked call enters
  with ``setns`` instead of making its own (``copy_net_ns`` and its teardown, ~0.5 ms a call);
- ``clone_waiter``: a call's init made as a clone sharing the server's memory, instead of ``posix_spawn``
  of ``sleep``.

Imports run one way: this module uses ``executor.sandbox.linux``'s primitives; child and parent use this.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import signal
import stat

from executor.sandbox.linux import (
    CLONE_NEWNET,
    DEVICE_PATHS,
    PR_SET_NO_NEW_PRIVS,
    capset_buffers,
    errno_text,
    libc,
    socket_filter,
    landlock_abi,
    no_sockets,
)

__all__ = ["clone_waiter", "empty_network_fd", "enter_empty_network", "landlock_abi_prepared", "prepare_confinement",
           "prepare_empty_network", "prepared_fds", "prepared_rules", "release_prepared", "require_no_sockets"]


#: The worker's one empty network namespace (a fork server's, made once: ``prepare_empty_network``), or None.
_empty_network: int | None = None


def prepare_empty_network() -> str:
    """Make, once per fork server, the empty network namespace every non-networked call then enters.

    A fresh network namespace per call costs ~0.5 ms of the tool process's CPU (``copy_net_ns``:
    sysctl tables, a loopback device) and more again when the kernel tears it down. Nothing can
    be left in one for a later call where nothing in it can make a socket: the tool processes that
    enter it refuse ``socket(2)`` of every family with seccomp before any tool code runs
    (``confine``; a call whose filter fails is refused: ``require_no_sockets``) and hold no socket
    of their own (every descriptor is closed first), and its loopback stays down. So the fork
    server makes it here, where seccomp is proven to refuse sockets, and keeps a descriptor of it;
    elsewhere each call makes its own. Returns how.
    """
    global _empty_network
    if socket_filter() is None:
        return "per call (no seccomp filter for this machine)"
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a helper: makes the namespace, proves that seccomp refuses sockets in it, holds it for our open
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            if libc.unshare(CLONE_NEWNET) == 0 and _proves_no_sockets():
                code = 0
                os.write(ready_w, b"1")
                os.read(hold_r, 1)
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            return "per call (the helper could not make one)"
        _empty_network = _out_of_the_way(os.open(f"/proc/{_host_pid_of_child(pid)}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        return f"per call ({exc})"
    finally:
        os.close(ready_r)
        os.close(hold_w)
        os.waitpid(pid, 0)
    return "shared"


def _proves_no_sockets() -> bool:
    """In a throwaway process: ``no_new_privs`` and the socket filter on, a socket must then be refused."""
    import socket  # noqa: PLC0415 - only the helper process proves it

    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if no_sockets() != "seccomp":
        return False
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    except PermissionError:
        return True
    return False


def _host_pid_of_child(pid: int) -> int:
    """A child's pid as ``/proc`` (the host's) names it: a fork server in a PID namespace of its own knows another."""
    fd = os.pidfd_open(pid)
    try:
        with open(f"/proc/self/fdinfo/{fd}") as fh:
            for line in fh:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    finally:
        os.close(fd)
    return pid


def empty_network_fd() -> int | None:
    """The descriptor of the worker's empty network namespace (the tool process keeps it until it entered it)."""
    return _empty_network


def enter_empty_network() -> str:
    """Enter the worker's empty network namespace (before a user namespace of the call's own: it needs the fork
    server's capabilities). Returns how (``netns``, else why not: the caller then makes a namespace of the call's
    own); a call in it must refuse sockets (``require_no_sockets``). Closes the descriptor either way."""
    global _empty_network
    fd, _empty_network = _empty_network, None
    if fd is None:
        return "unavailable (none prepared)"
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            return f"unavailable ({errno_text()})"
    finally:
        os.close(fd)
    return "netns"


def require_no_sockets(applied: dict[str, str]) -> None:
    """A call in the shared empty network namespace must refuse sockets: one whose filter failed is not run."""
    if applied.get("network_ns") == "shared" and applied.get("sockets") != "seccomp":
        raise OSError(errno.EPERM, f"the shared empty network namespace needs the socket filter: {applied.get('sockets')}")


#: Landlock rules opened once per fork server (``prepare_confinement``): path → (its ``O_PATH`` descriptor, whether a
#: directory), and the kernel's ABI. A tool process adds them to its own ruleset (one syscall each) instead of
#: opening and checking every read path again; it closes them once it is confined.
_prepared_paths: dict[str, tuple[int, bool]] = {}
_prepared_abi = 0


def prepare_confinement(read_paths: list[str]) -> None:
    """Once per fork server: open the Landlock rules' paths (every call's read paths and devices), build the seccomp
    program and the capability buffers; each tool process forked after it only uses them."""
    global _prepared_abi
    _prepared_abi = landlock_abi()
    for path in [*read_paths, *DEVICE_PATHS]:
        if path in _prepared_paths:
            continue
        try:
            fd = _out_of_the_way(os.open(path, os.O_PATH | os.O_CLOEXEC))
        except OSError:
            continue  # a path that does not exist here needs no rule
        _prepared_paths[path] = (fd, stat.S_ISDIR(os.fstat(fd).st_mode))
    socket_filter()
    capset_buffers()


def _out_of_the_way(fd: int) -> int:
    """``fd`` moved to 32 or above: a tool process puts the call's pipes at 1, 2 and 4 and must not overwrite it."""
    import fcntl  # noqa: PLC0415

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 32)
    finally:
        os.close(fd)


def prepared_rules() -> dict[str, tuple[int, bool]]:
    """The rules' paths opened by ``prepare_confinement`` (path → descriptor, whether a directory), for ``confine``."""
    return _prepared_paths


def landlock_abi_prepared() -> int:
    """The kernel's Landlock ABI as ``prepare_confinement`` read it (0: not prepared, ask the kernel)."""
    return _prepared_abi


def prepared_fds() -> list[int]:
    """Descriptors a tool process keeps until it is confined (its Landlock rules' paths, the empty network's)."""
    return [fd for fd, _ in _prepared_paths.values()] + ([_empty_network] if _empty_network is not None else [])


def release_prepared() -> None:
    """In a tool process, before any tool code: close the prepared descriptors (no tool code ever holds them)."""
    global _empty_network
    for fd in prepared_fds():
        with contextlib.suppress(OSError):
            os.close(fd)
    _prepared_paths.clear()
    _empty_network = None


CLONE_VM, CLONE_FILES = 0x00000100, 0x00000400
_SYS_PAUSE_X86_64 = 34
_WAITER_STACK_BYTES = 64 * 1024
_waiter_stack: ctypes.Array | None = None


def clone_waiter() -> int | None:
    """A child that shares this process's memory and descriptor table and only waits: a call's init, made without
    copying a page table or starting a program (``posix_spawn`` of ``sleep`` costs ~0.7 ms of CPU a call).

    It runs no code of ours: libc's ``clone`` starts it in libc's ``syscall`` stub, which makes the ``pause``
    system call and touches no thread-local state, with every signal blocked (the mask is the caller's at the
    clone, restored in the caller at once), so nothing but SIGKILL ever ends or wakes it. Holding no descriptor
    of its own (the table is shared), it keeps no pipe of a call open. Its stack is the same for every waiter:
    one at a time, each waited for before the next is made. The caller must die with its PID namespace (a
    waiter has no timer of its own). x86-64 only; None elsewhere or when ``clone`` fails.
    """
    global _waiter_stack
    if platform.machine() != "x86_64":
        return None
    if _waiter_stack is None:
        _waiter_stack = ctypes.create_string_buffer(_WAITER_STACK_BYTES)
        libc.clone.restype = ctypes.c_int
        libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    top = (ctypes.addressof(_waiter_stack) + _WAITER_STACK_BYTES - 64) & ~0xF
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = libc.clone(ctypes.cast(libc.syscall, ctypes.c_void_p), top, CLONE_VM | CLONE_FILES | signal.SIGCHLD,
                          _SYS_PAUSE_X86_64)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return pid if pid > 0 else None
