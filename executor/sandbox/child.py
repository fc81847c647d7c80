"""The sandboxed side of a tool run: the tool process, its confinement and the Linux primitives it uses.

``python -m executor.sandbox.parent --forkserver FD`` runs the fork server
(``executor.sandbox.parent.serve_forks``); without it, one spawned call parent serves one call
(its stdio the call's pipes, the result pipe fd 3, ``RESULT_FD``). Either way the call's
parent, which never runs tool code and alone holds the result pipe, forks the **tool
process** (``tool_process``, here), which

- closes every descriptor but its answer pipe, stdio and the progress pipe;
- sets up, while it still holds its privileges, the call's namespaces (``tool_namespaces``):
  a user namespace when the worker is not root (RLIMIT_NPROC then counts this call's
  processes only — the kernel tracks process counts per user namespace), a mount namespace
  in which the call's scratch dir is bind-mounted over the scratch root (no other call's dir
  is even visible), an empty network namespace unless the tool is networked, an IPC
  namespace (System V objects and message queues die with the call); the call's uid (root:
  ``SANDBOX_UID_BASE`` + its pid) and rlimits;
- imports the tool (registry code, trusted) and confines itself: the call's own uid, no
  capabilities, ``no_new_privs``, Landlock (read-only on exactly the interpreter, its
  libraries and the tool packages; read-write on the scratch dir), and a seccomp filter
  that refuses ``socket(2)`` of every family for non-networked tools;
- writes one line saying which layers it applied (the trusted header) before any tool code
  runs; the tool's return value follows.

It runs in a PID namespace of the call's own, whose PID 1 is a waiting ``sleep`` started by
the parent: everything the tool leaves is reparented to it, counted, and killed with it. The
parent is outside that namespace: the tool has no pid for it.

The tool's own prints stay on stdout and stderr (the worker reads both, capped, and logs
each line with the call id); structured logs are JSON lines on stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import importlib
import importlib.util
import inspect
import json
import os
import platform
import resource
import signal
import stat
import struct
import sys
import re
import time
import traceback
from typing import Any

#: The descriptor a spawned call parent writes its one result frame to; the tool process never holds it.
RESULT_FD = 3
#: Per-call uids start here (root only): uid = base + the tool process's pid, unique among live processes.
SANDBOX_UID_BASE = 1_000_000
#: The call's progress pipe: the tool process writes ``report_progress`` lines to it (``tools.context``), the
#: worker reads them as they come (``executor.sandbox.progress``), as untrusted as anything the tool writes.
PROGRESS_FD = 4
MAX_RESULT_BYTES = 1_000_000
#: Nesting depth a result may have (objects and arrays); deeper is ``tool_output_invalid``.
MAX_RESULT_DEPTH = 64

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPSET = 126
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights (uapi/linux/landlock.h).
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
_FS_ABI_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

#: Non-secret system files a Python tool may need (loader cache, time zone, resolver, CA certs).
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime",
                     "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf",
                     "/etc/services", "/etc/protocols", "/etc/ssl", "/etc/ca-certificates", "/etc/pki")
DEVICE_PATHS = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
#: Packages of this platform a tool imports through ``tools.context`` and friends.
PLATFORM_PACKAGES = ("toolrail", "tools", "executor")
#: A tool's own error type (``tools.errors.ToolError.type``): snake_case, a letter first, at most 64 characters.
TOOL_ERROR_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: The platform's types a tool raises on purpose (``tools.errors``): a tool may report them as they are.
TOOL_RAISABLE_TYPES = frozenset({"tool_error", "tool_input_error", "insufficient_funds", "pattern_budget_exceeded"})
#: What the sandbox's own code in the tool process reports (``classify``, ``encode_result``, a failed set-up).
SANDBOX_REPORTED_TYPES = frozenset({"tool_memory_limit", "tool_output_invalid", "sandbox_denied", "tool_process_limit",
                                    "sandbox_error"})
#: Prefixes of the platform's own outcomes (limits, crashes, the sandbox, MCP servers): never a tool's own type.
RESERVED_TYPE_PREFIXES = ("tool_", "sandbox_", "mcp_", "toolrail_", "executor_")
#: The platform's other error types (the job API's, the run loop's, the check path's): never a tool's own type.
RESERVED_TYPES = frozenset({
    "ambiguous_output", "approval_conflict", "approval_expired", "call_as_text", "call_in_progress", "circuit_open",
    "concurrency_limited", "decider_unavailable", "generation_bound", "idempotency_conflict", "invalid_arguments",
    "invalid_output", "invalid_tool_calls", "not_found", "permanent", "rate_limited", "rejected", "repeated_call",
    "repeated_side_effect", "retryable", "schema_rejected", "store_unavailable", "timeout", "ungrounded_values",
    "unknown_tool", "unsupported_pattern", "validation_error", "webhook_url_not_allowed"})


def tool_error_type(claimed: Any, *, from_sandbox: bool = False) -> str | None:
    """``claimed`` when a tool may report it as its error's type, else None (the error is then ``tool_error``).

    A tool's own type (``order_not_found``) is kept; one that is not snake_case of at most 64
    characters, or that names an outcome of the platform's own (``tool_timeout``,
    ``sandbox_denied``, ``circuit_open``, ...), is refused, so a tool cannot pass its failure off
    as the platform's. ``from_sandbox``: the answer of a tool process, whose sandbox code also
    reports the failures it classifies itself (``SANDBOX_REPORTED_TYPES``).
    """
    if not isinstance(claimed, str) or not TOOL_ERROR_TYPE.fullmatch(claimed):
        return None
    if claimed in TOOL_RAISABLE_TYPES or (from_sandbox and claimed in SANDBOX_REPORTED_TYPES):
        return claimed
    if claimed in RESERVED_TYPES or claimed.startswith(RESERVED_TYPE_PREFIXES):
        return None
    return claimed

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class OutputError(ValueError):
    """A tool's answer that is not a bounded JSON object (the call parent's typed refusal)."""


# ----------------------------------------------------------------- namespaces (tool process)


def _errno_text() -> str:
    code = ctypes.get_errno()
    return f"errno {code} {errno.errorcode.get(code, '')}".strip()


def enter_user_namespace() -> str:
    """A user namespace of this call's own, mapping only the worker's uid and gid (non-root workers).

    The kernel counts RLIMIT_NPROC per user namespace, so inside it the limit binds this
    call's processes, not every process of the worker's uid.
    """
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER) != 0:
        return f"unavailable ({_errno_text()})"
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # our own /proc files are root's while not dumpable
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    except OSError as exc:
        return f"failed ({exc})"
    finally:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return "userns"


def drop_network() -> str:
    """Enter a fresh network namespace (no interfaces but a down loopback). Returns how."""
    if _libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return f"unavailable ({_errno_text()})"


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source} on {target}: {os.strerror(code)}")


def private_mounts() -> None:
    """A mount namespace of this process's own whose changes never propagate back to the host."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWNS): {os.strerror(code)}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def hide_other_calls(scratch_dir: str, scratch_root: str) -> str:
    """In a new mount namespace, bind the call's scratch dir over the scratch root.

    The tool then sees only its own dir at the root's path: other calls' dirs are not
    readable, not listable, not even there — whatever Landlock and file modes say.
    """
    try:
        private_mounts()
        _mount(scratch_dir, scratch_root, None, MS_BIND)
    except OSError as exc:
        return f"unavailable ({exc})"
    return "own-mount"


def own_ipc() -> str:
    """An IPC namespace of the call's own: System V objects and POSIX message queues die with the call.

    Without it a tool could leave world-readable shared memory (``shmget`` with mode 0666) for a
    later call, another tenant's, to attach by key: Landlock and per-call uids do not cover IPC.
    """
    if _libc.unshare(CLONE_NEWIPC) != 0:
        return f"unavailable ({_errno_text()})"
    return "ipcns"


def new_pid_namespace() -> str:
    """The next child is PID 1 of a new PID namespace: when it exits, the kernel kills the rest."""
    if _libc.unshare(CLONE_NEWPID) != 0:
        return f"unavailable ({_errno_text()})"
    return "pidns"


def make_reachable(paths: list[str]) -> list[str]:
    """Let an unprivileged per-call uid reach ``paths`` without any capability (root workers).

    Python often lives under a directory only root may search (``/root/.pyenv``). In this
    process's private mount namespace each such directory is covered with an empty tmpfs
    (mode 0711) into which exactly the needed entries are bind-mounted back: everything
    else in it stays hidden. Returns the directories covered.
    """
    covered: list[str] = []
    for _ in range(8):  # each round opens the topmost blocking directory of every path
        blockers: dict[str, set[str]] = {}
        for path in paths:
            current = "/"
            for name in [p for p in os.path.abspath(path).split("/") if p]:
                try:
                    mode = os.stat(current).st_mode
                except OSError:
                    break
                if current != "/" and not mode & stat.S_IXOTH:
                    blockers.setdefault(current, set()).add(name)
                    break
                current = os.path.join(current, name)
        if not blockers:
            return covered
        for folder, names in sorted(blockers.items()):
            fds = {}
            for name in sorted(names):
                with contextlib.suppress(OSError):
                    fds[name] = os.open(os.path.join(folder, name), os.O_PATH | os.O_CLOEXEC)
            try:
                _mount("tmpfs", folder, "tmpfs", 0, "mode=0711,size=64k")
                for name, fd in fds.items():
                    target = os.path.join(folder, name)
                    if stat.S_ISDIR(os.fstat(fd).st_mode):
                        os.mkdir(target)
                    else:
                        open(target, "w").close()  # noqa: SIM115 - an empty mount point
                    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
            finally:
                for fd in fds.values():
                    os.close(fd)
            covered.append(folder)
    return covered


# ----------------------------------------------------------------- confinement (tool process)


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel, 0 when unavailable."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def _fs_rights(abi: int) -> int:
    return _FS_ABI_RIGHTS[max(k for k in _FS_ABI_RIGHTS if k <= abi)]


def _landlock(read_paths: list[str], write_paths: list[str], device_paths: list[str]) -> str:
    """Restrict this process (and its future children) to the given hierarchies."""
    abi = landlock_abi()
    if abi <= 0:
        return f"unavailable ({_errno_text()})"
    handled = _fs_rights(abi)
    ruleset = -1
    scoped = ""
    if abi >= 6:  # also forbid signals and abstract sockets towards anything outside the sandbox
        attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0, _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET))
        ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(24), ctypes.c_uint32(0))
        scoped = "+scoped" if ruleset >= 0 else ""
    if ruleset < 0:
        attr = ctypes.create_string_buffer(struct.pack("=Q", handled))
        ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"unavailable ({_errno_text()})"
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    try:
        for paths, access in ((read_paths, read), (write_paths, handled),
                              (device_paths, FS_READ_FILE | FS_WRITE_FILE)):
            for path in paths:
                _add_rule(int(ruleset), path, access & handled)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"failed ({_errno_text()})"
    finally:
        os.close(int(ruleset))
    return f"landlock-v{abi}{scoped}"


def _add_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist here needs no rule
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_RIGHTS
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd))
        if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), rule,
                         ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock rule for {path}")
    finally:
        os.close(fd)


def _socket_filter() -> bytes | None:
    """A classic-BPF seccomp program: ``socket(2)`` and io_uring fail with EACCES (x86-64, aarch64)."""
    machine = platform.machine()
    if machine == "x86_64":
        arch, banned = 0xC000003E, (41, 425)  # AUDIT_ARCH_X86_64; socket, io_uring_setup
    elif machine == "aarch64":
        arch, banned = 0xC00000B7, (198, 425)  # AUDIT_ARCH_AARCH64; socket, io_uring_setup
    else:
        return None
    ld_w_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES
    prog = [(ld_w_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (ld_w_abs, 0, 0, 0),
            (jge, len(banned) + 1, 0, 0x40000000)]  # x32 numbers on x86-64: refused
    for i, nr in enumerate(banned):
        prog.append((jeq, len(banned) - i, 0, nr))
    prog += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def no_sockets() -> str:
    """Forbid creating sockets of any family from now on (needs ``no_new_privs``)."""
    program = _socket_filter()
    if program is None:
        return f"unavailable (no filter for {platform.machine()})"
    buf = ctypes.create_string_buffer(program)
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog)
    if _libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.c_void_p(ctypes.addressof(fbuf)),
                   ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        return f"unavailable ({_errno_text()})"
    return "seccomp"


def _package_dirs(modules: list[str]) -> list[str]:
    out: list[str] = []
    for name in modules:
        out.extend(_package_dir(name.split(".", 1)[0]))
    return out


@functools.lru_cache(maxsize=256)
def _package_dir(top: str) -> tuple[str, ...]:
    """Where top-level package ``top`` lives: its folders, or its single file (cached: the fork server warms it)."""
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ()
    if found is None:
        return ()
    if found.submodule_search_locations:
        return tuple(found.submodule_search_locations)
    if found.origin and os.path.isfile(found.origin):
        return (found.origin,)
    return ()


def _is_library_dir(entry: str) -> bool:
    """The interpreter's own library directories: the stdlib, lib-dynload, site-packages, zips."""
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    real = os.path.realpath(entry)
    if any(real == p or real.startswith(p + os.sep) for p in prefixes):
        return True
    return os.path.basename(real) in {"site-packages", "dist-packages"}


def read_paths(modules: list[str], *, exclude: list[str] = ()) -> list[str]:
    """Exactly what a tool may read: the interpreter, its libraries, the tool packages, system libraries.

    Never a bare directory of the module search path (a project folder, the worker's working
    directory): of those, only the package dir (or the single file) of each tool module and
    of this platform's packages. Nothing at or below an ``exclude`` path (the scratch root).
    Computed once per (modules, exclusions, module search path): the fork server warms it, so
    a tool process only looks it up.
    """
    return list(_read_paths(tuple(sorted(set(modules))), tuple(exclude), tuple(sys.path)))


@functools.lru_cache(maxsize=64)
def _read_paths(modules: tuple[str, ...], exclude: tuple[str, ...], search_path: tuple[str, ...]) -> tuple[str, ...]:
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for entry in search_path:
        if entry and os.path.isdir(entry) and _is_library_dir(entry):
            paths.add(os.path.abspath(entry))
        elif entry and os.path.isfile(entry) and entry.endswith(".zip"):
            paths.add(os.path.abspath(entry))
    paths.update(_package_dirs([*PLATFORM_PACKAGES, *modules]))
    paths.update(SYSTEM_READ_PATHS)
    fenced = [os.path.realpath(p) for p in exclude if p]

    def allowed(path: str) -> bool:
        real = os.path.realpath(path)
        return real != "/" and not any(real == f or real.startswith(f + os.sep) or f.startswith(real + os.sep)
                                       for f in fenced)

    return tuple(sorted(p for p in paths if allowed(p)))


def _capset(keep: int) -> None:
    header = ctypes.create_string_buffer(struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(struct.pack("=IIIIII", keep, keep, 0, 0, 0, 0))
    if _libc.syscall(_SYS_CAPSET, header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def effective_caps() -> int:
    """This process's effective capability set (``CapEff`` of ``/proc/self/status``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


def confine(*, uid: int | None, scratch_dir: str, read: list[str], network: bool, own_proc: str) -> dict[str, str]:
    """Drop privileges, restrict the filesystem and (non-networked) sockets; report what was applied."""
    applied: dict[str, str] = {}
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        applied["uid"] = str(uid)
    else:
        applied["uid"] = "unchanged (not root)" if os.geteuid() != 0 else "unchanged (not asked)"
    with contextlib.suppress(OSError):
        _capset(0)  # a user namespace gave this process every capability in it: none survive
    applied["caps"] = "none" if effective_caps() == 0 else f"kept {effective_caps():#x}"
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    applied["filesystem"] = _landlock([*read, own_proc], [scratch_dir], list(DEVICE_PATHS))
    applied["sockets"] = "allowed (networked)" if network else no_sockets()
    die_with_parent()  # changing credentials cleared the parent-death signal
    return applied


# ----------------------------------------------------------------- leftovers


def children(pid: int | None = None) -> list[int]:
    """Live children of ``pid`` (default: this process), read from ``/proc``."""
    out: list[int] = []
    me = pid or _host_pid()
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children") as fh:
                out.extend(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            pass
    return out


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _live(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are not zombies."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(pid)
        except (OSError, IndexError):
            pass
    return out


def kill_leftovers(uid: int | None = None) -> int:
    """Kill every process left below the call parent; returns how many were found.

    Without a PID namespace, orphans reparent here (child subreaper), even after ``setsid``,
    and are killed round by round as their own children reparent (with one, they went to the
    call's init, which the call parent counts and kills). A call's own uid is swept through ``/proc`` too.
    """
    _reap()
    found = len(_live(children()))
    if not found and uid is None:
        return 0
    for _ in range(200):  # a fork bomb keeps spawning while we kill: repeat until quiet
        victims = _live(children())
        if uid is not None:
            victims += _live([int(e) for e in os.listdir("/proc") if e.isdigit() and _owned_by(e, uid)])
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        if not victims:
            break
        time.sleep(0.005)
    return found


def _owned_by(pid: str, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False


# ----------------------------------------------------------------- results


def json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, without recursion (a hostile value cannot blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in node)
    return deepest


def decode_object(data: bytes, *, what: str, max_bytes: int = MAX_RESULT_BYTES, max_depth: int = MAX_RESULT_DEPTH) -> dict:
    """``data`` as a JSON object of bounded size and depth, or ``OutputError`` saying why not."""
    if len(data) > max_bytes:
        raise OutputError(f"{what} of more than {max_bytes} bytes")
    try:
        value = json.loads(data)
    except RecursionError:
        raise OutputError(f"{what} nests deeper than the JSON decoder allows") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise OutputError(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OutputError(f"{what} is a JSON {type(value).__name__}, not an object")
    if json_depth(value) > max_depth:
        raise OutputError(f"{what} nests deeper than {max_depth} levels")
    return value


def _error(kind: str, message: str, **details: Any) -> dict:
    return {"ok": False, "error": {"type": kind, "message": message, "details": details}}


def _checked_answer(payload: dict) -> dict:
    """The tool process's answer reduced to ``{ok, result}`` or ``{ok: false, error}`` of known shape."""
    if payload.get("ok") is True:
        if not isinstance(payload.get("result"), dict):
            return _error("tool_output_invalid", "the tool's result is not a JSON object")
        return {"ok": True, "result": payload["result"]}
    error = payload.get("error")
    if payload.get("ok") is not False or not isinstance(error, dict):
        return _error("tool_output_invalid", "the tool's answer has neither a result nor an error")
    claimed = error.get("type")
    kind = tool_error_type(claimed, from_sandbox=True) or "tool_error"
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    if claimed is not None and kind != claimed:  # the tool claimed a type it may not: say so, do not believe it
        details = {**details, "refused_type": str(claimed)[:80]}
    return {"ok": False, "error": {"type": kind, "message": str(error.get("message", "tool failed"))[:2000],
                                   "details": details}}


def encode_result(payload: dict) -> bytes:
    """The tool process's answer as JSON; a value that cannot be one becomes a typed error."""
    try:
        result = payload.get("result")
        if payload.get("ok") and hasattr(result, "model_dump"):
            payload = {**payload, "result": result.model_dump(mode="json")}
        if payload.get("ok") and not isinstance(payload.get("result"), dict):
            kind = type(payload.get("result")).__name__
            payload = _error("tool_output_invalid", f"the tool returned a {kind}; a tool returns a JSON object (a dict)")
        return json.dumps(payload, ensure_ascii=False, default=str).encode()
    except RecursionError:
        return json.dumps(_error("tool_output_invalid", "the tool's result nests too deeply to encode")).encode()
    except (TypeError, ValueError) as exc:
        return json.dumps(_error("tool_output_invalid", f"the tool's result is not JSON: {exc}")).encode()


# ----------------------------------------------------------------- the tool process


def _load(entrypoint: str):
    module_name, _, func_name = entrypoint.partition(":")
    return getattr(importlib.import_module(module_name), func_name)


def _call(func, arguments: dict):
    params = list(inspect.signature(func).parameters.values())
    if params and isinstance(params[0].annotation, type) and hasattr(params[0].annotation, "model_validate"):
        return func(params[0].annotation.model_validate(arguments))
    hints = getattr(func, "__annotations__", {})
    first = hints.get(params[0].name) if params else None
    if isinstance(first, str) and params:
        model = getattr(sys.modules[func.__module__], first, None)
        if model is not None and hasattr(model, "model_validate"):
            return func(model.model_validate(arguments))
    return func(**arguments)


def classify(exc: BaseException) -> dict:
    """The typed error of a tool exception: the sandbox's refusals get types of their own."""
    if isinstance(exc, MemoryError):
        return {"type": "tool_memory_limit", "message": "the tool exceeded its memory limit", "details": {}}
    to_dict = getattr(exc, "to_dict", None)
    if callable(to_dict):  # a ``ToolError``: the tool's own type, message and details
        error = to_dict()
        claimed = error.get("type") if isinstance(error, dict) else None
        if isinstance(error, dict) and claimed is not None and tool_error_type(claimed) is None:
            details = error.get("details") if isinstance(error.get("details"), dict) else {}
            error = {**error, "type": "tool_error", "details": {**details, "refused_type": str(claimed)[:80]}}
        return error
    name = type(exc).__name__
    details = {"exception": name}
    if isinstance(exc, RecursionError):
        return {"type": "tool_error", "message": f"{name}: {exc}", "details": details}
    if isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN and "fork" in traceback.format_exc():
        return {"type": "tool_process_limit", "message": f"the tool hit its process limit: {exc}", "details": details}
    if isinstance(exc, PermissionError) or (isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM)):
        return {"type": "sandbox_denied", "message": f"the sandbox denied an operation: {name}: {exc}",
                "details": {**details, "filename": getattr(exc, "filename", None)}}
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return {"type": "sandbox_denied", "message": f"the tool has no network: {name}: {exc}", "details": details}
    return {"type": "tool_error", "message": f"{name}: {exc}", "details": details}


#: Most characters of a tool's traceback (``details.traceback``), and most frames; the innermost are kept.
MAX_TRACEBACK_CHARS = 4000
MAX_TRACEBACK_FRAMES = 20


def _tool_scope(module_name: str) -> tuple[list[str], str]:
    """Where the tool's own code lives (its top-level package's folders, or its module file) and the folder paths
    are shown relative to. A tool module inside one of the platform's packages (``tools.builtin``) is its file only."""
    top = module_name.split(".")[0]
    module = sys.modules.get(module_name if top in PLATFORM_PACKAGES else top)
    if module is None:
        return [], ""
    folders = [os.path.realpath(p) for p in getattr(module, "__path__", None) or []] if top not in PLATFORM_PACKAGES \
        else []
    if folders:
        return folders, os.path.dirname(folders[0])
    origin = getattr(module, "__file__", None)
    if not origin:
        return [], ""
    origin = os.path.realpath(origin)
    base = os.path.dirname(origin)
    for _ in range(module_name.count(".") if top in PLATFORM_PACKAGES else 0):
        base = os.path.dirname(base)  # tools/builtin.py, relative to the folder holding ``tools``
    return [origin], base


def tool_traceback(exc: BaseException, module_name: str) -> str:
    """``exc``'s traceback in the tool's own frames only, each path relative to the folder holding its package.

    The platform's frames (the sandbox that called the tool) and frames of libraries the tool
    called are left out, so no absolute path of the server appears; at most
    ``MAX_TRACEBACK_FRAMES`` frames and ``MAX_TRACEBACK_CHARS`` characters, the innermost kept.
    """
    scope, base = _tool_scope(module_name)
    frames = []
    for frame in traceback.extract_tb(exc.__traceback__):
        real = os.path.realpath(frame.filename)
        if any(real == s or real.startswith(s + os.sep) for s in scope):
            frames.append(traceback.FrameSummary(os.path.relpath(real, base), frame.lineno, frame.name,
                                                 line=frame.line))
    text = "".join(traceback.format_list(frames[-MAX_TRACEBACK_FRAMES:]))
    summary = "".join(traceback.format_exception_only(type(exc), exc))
    return ("Traceback (the tool's own frames):\n" + text)[-(MAX_TRACEBACK_CHARS - min(len(summary), 1000)):] \
        + summary[:1000]


_parent_pid: int | None = None


def name_process(name: bytes) -> None:
    """The name ``ps`` and ``top`` show for this process (its role in the call), at most 15 bytes."""
    _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (no orphaned tool runs).

    The parent is the one seen first by this process (``remember_parent``): inside a PID
    namespace a parent outside it reads as 0, and one that died leaves us with the call's
    init (1) as parent, so only a change of ``getppid()`` means "orphaned".
    """
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != (_parent_pid if _parent_pid is not None else os.getppid()) or (
            _parent_pid is None and os.getppid() == 1):
        os._exit(0)


def remember_parent() -> None:
    """Call first thing after a fork: the parent ``die_with_parent`` guards."""
    global _parent_pid
    _parent_pid = os.getppid()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _host_pid() -> int:
    """This process's pid as the host's ``/proc`` sees it (``getpid`` says 1 inside a PID namespace)."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


_logging_configured = False


def configure_tool_logging() -> None:
    """If a tool module uses structlog: JSON lines on stderr, carrying the call's ids (once per process lineage).

    The sandbox itself does not need structlog (``_emit``): a fork server whose tools do not
    import it stays ~10 MB smaller (structlog brings rich, pygments, attrs and asyncio), and
    every process forked per call copies, touches and tears down less.
    """
    global _logging_configured
    if _logging_configured or "structlog" not in sys.modules:
        return
    import structlog  # noqa: PLC0415 - already imported by a tool module

    structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                                    structlog.processors.JSONRenderer(ensure_ascii=False)],
                        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr))  # one write per line
    _logging_configured = True


def _bind_tool_logging(ids: dict[str, str]) -> None:
    """The call's ids on every structlog line of the tool's own (when its module uses structlog)."""
    configure_tool_logging()
    if _logging_configured:
        import structlog  # noqa: PLC0415

        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**ids)


def _emit(event: str, ids: dict[str, str], **fields: Any) -> None:
    """One sandbox event (``tool.start``, ``tool.end``) as a JSON line on stderr, the shape structlog writes."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1_000_000):06d}Z"
    record = {**fields, "event": event, **ids, "level": "info", "timestamp": stamp, "logger": "toolrail.sandbox"}
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        sys.stderr.flush()


#: rlimits a tool process sets on itself, by the names the worker sends them under.
LIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "nofile": resource.RLIMIT_NOFILE,
          "fsize": resource.RLIMIT_FSIZE, "core": resource.RLIMIT_CORE, "nproc": resource.RLIMIT_NPROC}


def tool_namespaces(request: dict) -> tuple[dict, dict[str, str]]:
    """The tool process's own namespaces, uid and limits, set up before any tool code runs.

    It still holds its privileges here (root, or every capability in a user namespace of its
    own): a user namespace when the worker is not root (RLIMIT_NPROC then counts this call's
    processes only), the call's uid (root: ``SANDBOX_UID_BASE`` + its pid, owner of the
    scratch dir), a mount namespace showing only its scratch dir, an empty network namespace
    unless networked, an IPC namespace, and the call's rlimits. Returns the request as the tool
    sees it (the scratch dir at the scratch root's path) and what was applied.
    """
    setup: dict[str, str] = {}
    limits = {k: tuple(v) for k, v in (request.get("limits") or {}).items() if k in LIMITS}
    if os.geteuid() != 0:
        setup["userns"] = enter_user_namespace()
        if setup["userns"] == "userns" and "nproc" in limits:
            setup["processes"] = f"{limits['nproc'][0]} per call (user namespace)"
        else:
            limits.pop("nproc", None)  # without a namespace of its own the count would be the worker's whole uid
    elif request.get("own_uid"):
        uid = SANDBOX_UID_BASE + _host_pid()
        os.chown(request["scratch_dir"], uid, uid)
        request = {**request, "uid": uid}
        if "nproc" in limits:
            setup["processes"] = f"{limits['nproc'][0]} per call (own uid)"
    else:
        limits.pop("nproc", None)
    setup.setdefault("processes", "unlimited per call")
    setup["scratch"] = hide_other_calls(request["scratch_dir"], request["scratch_root"])
    if setup["scratch"] == "own-mount":
        request = {**request, "scratch_dir": request["scratch_root"]}
    setup["network"] = "allowed" if request.get("network") else drop_network()
    setup["ipc"] = own_ipc()
    for name, (soft, hard) in limits.items():
        resource.setrlimit(LIMITS[name], (int(soft), int(hard)))
    return request, setup


def tool_process(request: dict, answer_fd: int, modules: list[str]) -> None:
    """Set up the call's namespaces, import, confine, run the tool; write the trusted header line, then the answer.

    Never returns. Everything before the header line is platform code: the tool's own code
    runs only after it, confined.
    """
    name_process(b"tr-tool")
    remember_parent()
    keep = sorted({answer_fd, PROGRESS_FD} if _progress_pipe else {answer_fd})
    for low, high in zip([RESULT_FD, *(fd + 1 for fd in keep)], [*keep, 1 << 16]):
        os.closerange(low, high)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    die_with_parent()
    from tools.context import CallContext, flush_progress, set_current_call  # noqa: PLC0415

    ids = {"request_id": request["request_id"], "job_id": request["job_id"], "call_id": request["call_id"],
           "tool": request["tool"]}
    isolation: dict[str, str] = {}
    try:
        request, isolation = tool_namespaces(request)
        func = _load(request["entrypoint"])
        _bind_tool_logging(ids)
        if request.get("confine", True):
            read = read_paths([*modules, request["entrypoint"].partition(":")[0]],
                              exclude=[request.get("scratch_root", "")])
            isolation.update(confine(uid=request.get("uid"), scratch_dir=request["scratch_dir"], read=read,
                                     network=bool(request.get("network")), own_proc=f"/proc/{_host_pid()}"))
        os.environ.update({**request.get("env", {}), "TMPDIR": request["scratch_dir"], "HOME": request["scratch_dir"]})
        os.chdir(request["scratch_dir"])
    except Exception as exc:  # noqa: BLE001 - a sandbox that cannot be set up must not run the tool
        _write_all(answer_fd, json.dumps({"isolation": isolation}).encode() + b"\n")
        _write_all(answer_fd, json.dumps(_error("sandbox_error", f"sandbox setup failed: {type(exc).__name__}: {exc}",
                                                exception=type(exc).__name__)).encode())
        os._exit(0)
    _write_all(answer_fd, json.dumps({"isolation": isolation}).encode() + b"\n")  # the last line the sandbox writes
    _emit("tool.start", ids, pid=_host_pid(), **{f"isolation_{k}": v for k, v in isolation.items()})
    set_current_call(CallContext(request_id=request["request_id"], job_id=request["job_id"], call_id=request["call_id"],
                                 idempotency_key=request["idempotency_key"], scratch_dir=request["scratch_dir"],
                                 progress_fd=PROGRESS_FD if _progress_pipe else None))
    me = os.getpid()
    try:
        payload: dict = {"ok": True, "result": _call(func, request["arguments"])}
    except BaseException as exc:  # noqa: BLE001 - every tool failure becomes a typed result
        if os.getpid() != me:
            os._exit(1)  # a process the tool forked unwound to here: it reports nothing
        error = classify(exc)
        if request.get("traceback") and isinstance(error, dict):  # asked for by the tool's spec or the operator
            details = error.get("details") if isinstance(error.get("details"), dict) else {}
            error = {**error, "details": {**details, "traceback": tool_traceback(exc, request["entrypoint"].partition(":")[0])}}
        payload = {"ok": False, "error": error}
    if os.getpid() != me:
        os._exit(0)  # a forked copy of the tool returned: only the tool process answers
    flush_progress()  # the report the rate limit held back goes before the answer
    _emit("tool.end", ids, ok=payload["ok"])
    try:
        _write_all(answer_fd, encode_result(payload))
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # interpreter teardown would only delay the call parent


#: Whether this process entered a user namespace of its own (a non-root call parent needs one for PID namespaces).
_own_userns = False


def mark_progress_pipe(present: bool) -> None:
    """This tool process holds the call's progress pipe at ``PROGRESS_FD`` (a fork server's call: set by its parent)."""
    global _progress_pipe
    _progress_pipe = present


def close_all(fds: Any) -> None:
    """Close each descriptor; one already closed is no error."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def in_own_user_namespace() -> bool:
    return _own_userns


def mark_own_user_namespace() -> None:
    global _own_userns
    _own_userns = True


#: Whether this process was given a progress pipe (at ``PROGRESS_FD``): only then may the tool process write there.
_progress_pipe = False

#: Modules of ``TOOLRAIL_SANDBOX_PRELOAD`` that failed to import here, with the reason (``check_entrypoints``).
preload_errors: dict[str, str] = {}


def preload_modules() -> list[str]:
    """Import the tool modules named in ``TOOLRAIL_SANDBOX_PRELOAD``; returns their names."""
    modules = [m for m in os.environ.get("TOOLRAIL_SANDBOX_PRELOAD", "tools.builtin").split(",") if m]
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a broken module fails its own calls, with the reason, not the pool
            preload_errors[module] = f"{type(exc).__name__}: {exc}"
    return modules


def check_entrypoints(entrypoints: list[str]) -> dict[str, Any]:
    """A "tool" that checks, confined like any tool, that every tool function can be loaded and read.

    Runs in a tool process after confinement: each module was imported by the sandbox
    before (as for a real call); its reason is kept if that failed. Its source must still
    be readable under Landlock, since a tool's lazy imports happen after confinement.
    """
    report: dict[str, str | None] = {}
    for entrypoint in entrypoints:
        module_name, _, func_name = entrypoint.partition(":")
        if module_name in preload_errors:
            report[entrypoint] = preload_errors[module_name]
            continue
        try:
            module = importlib.import_module(module_name)
            if not callable(getattr(module, func_name, None)):
                raise AttributeError(f"module {module_name!r} has no function {func_name!r}")
            origin = getattr(module, "__file__", None)
            if origin:
                with open(origin, "rb") as fh:
                    fh.read(1)
            report[entrypoint] = None
        except Exception as exc:  # noqa: BLE001 - every failure is reported by name
            report[entrypoint] = f"{type(exc).__name__}: {exc}"
    return {"entrypoints": report, "sys_path": [p for p in sys.path if p][:50]}


_reachable_done = False


def _reachable_for_own_uid(modules: list[str]) -> None:
    """As root with per-call uids: once per process (inherited by forks), ``make_reachable`` what tools read."""
    global _reachable_done
    if _reachable_done or os.geteuid() != 0 or os.environ.get("TOOLRAIL_SANDBOX_OWN_UID") != "1":
        return
    _reachable_done = True
    with contextlib.suppress(OSError):
        private_mounts()
        make_reachable(read_paths(modules))
