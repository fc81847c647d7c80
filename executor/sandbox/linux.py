"""The Linux primitives a tool run is confined with: namespaces, Landlock, seccomp, capabilities, prctl, leftovers.

Plain functions over the kernel's interfaces (``unshare``, ``mount``, ``landlock_*``, ``prctl``,
``capset``, ``/proc``), each returning how it applied a layer or ``unavailable (...)`` — the
policy of which to apply, to what, and in which order lives in ``executor.sandbox.child`` (the
tool process) and ``executor.sandbox.parent`` (the call's parent). Imports run one way: child,
parent and serve import this module, never the reverse; nothing here imports the platform.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import resource
import signal
import stat
import struct
import time
from collections.abc import Iterable

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
_SYS_CAPGET, _SYS_CAPSET = 125, 126
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
DEVICE_PATHS = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


# ----------------------------------------------------------------- namespaces (tool process)


def errno_text() -> str:
    code = ctypes.get_errno()
    return f"errno {code} {errno.errorcode.get(code, '')}".strip()


def enter_user_namespace() -> str:
    """A user namespace of this call's own, mapping only the worker's uid and gid (non-root workers).

    The kernel counts RLIMIT_NPROC per user namespace, so inside it the limit binds this
    call's processes, not every process of the worker's uid.
    """
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        return f"unavailable ({errno_text()})"
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # our own /proc files are root's while not dumpable
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    except OSError as exc:
        return f"failed ({exc})"
    finally:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return "userns"


def drop_network() -> str:
    """Enter a fresh network namespace (no interfaces but a down loopback). Returns how."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return f"unavailable ({errno_text()})"


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source} on {target}: {os.strerror(code)}")


def private_mounts() -> None:
    """A mount namespace of this process's own whose changes never propagate back to the host."""
    if libc.unshare(CLONE_NEWNS) != 0:
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
    if libc.unshare(CLONE_NEWIPC) != 0:
        return f"unavailable ({errno_text()})"
    return "ipcns"


def new_pid_namespace() -> str:
    """The next child is PID 1 of a new PID namespace: when it exits, the kernel kills the rest."""
    if libc.unshare(CLONE_NEWPID) != 0:
        return f"unavailable ({errno_text()})"
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
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def _fs_rights(abi: int) -> int:
    return _FS_ABI_RIGHTS[max(k for k in _FS_ABI_RIGHTS if k <= abi)]


def _landlock(read_paths: list[str], write_paths: list[str], device_paths: list[str], *,
              prepared: dict[str, tuple[int, bool]] | None = None, abi: int = 0) -> str:
    """Restrict this process (and its future children) to the given hierarchies.

    ``prepared``: rules' paths already open (path → its ``O_PATH`` descriptor, whether a directory: a fork
    server's, ``executor.sandbox.prepared``), added without opening them again; ``abi``: the kernel's, if known.
    """
    abi = abi or landlock_abi()
    if abi <= 0:
        return f"unavailable ({errno_text()})"
    handled = _fs_rights(abi)
    ruleset = -1
    scoped = ""
    if abi >= 6:  # also forbid signals and abstract sockets towards anything outside the sandbox
        attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0, _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET))
        ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(24), ctypes.c_uint32(0))
        scoped = "+scoped" if ruleset >= 0 else ""
    if ruleset < 0:
        attr = ctypes.create_string_buffer(struct.pack("=Q", handled))
        ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"unavailable ({errno_text()})"
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    try:
        for paths, access in ((read_paths, read), (write_paths, handled),
                              (device_paths, FS_READ_FILE | FS_WRITE_FILE)):
            for path in paths:
                _add_rule(int(ruleset), path, access & handled, prepared or {})
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"failed ({errno_text()})"
    finally:
        os.close(int(ruleset))
    return f"landlock-v{abi}{scoped}"


def _add_rule(ruleset: int, path: str, access: int, opened: dict[str, tuple[int, bool]]) -> None:
    prepared = opened.get(path)
    if prepared is not None:
        fd, is_dir = prepared
    else:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # a path that does not exist here needs no rule
    try:
        if not (is_dir if prepared is not None else stat.S_ISDIR(os.fstat(fd).st_mode)):
            access &= _FILE_RIGHTS
        rule = struct.pack("=Qi", access, fd)
        if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock rule for {path}")
    finally:
        if prepared is None:
            os.close(fd)


@functools.cache
def socket_filter() -> bytes | None:
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


@functools.cache
def _socket_fprog() -> tuple[ctypes.Array, ctypes.Array] | None:
    """The filter as the kernel takes it (``struct sock_fprog`` and the program it points to), built once."""
    program = socket_filter()
    if program is None:
        return None
    buf = ctypes.create_string_buffer(program)
    return buf, ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buf)))


def no_sockets() -> str:
    """Forbid creating sockets of any family from now on (needs ``no_new_privs``)."""
    prog = _socket_fprog()
    if prog is None:
        return f"unavailable (no filter for {platform.machine()})"
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.c_void_p(ctypes.addressof(prog[1])),
                   ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        return f"unavailable ({errno_text()})"
    return "seccomp"


@functools.cache
def capset_buffers() -> tuple[ctypes.Array, ctypes.Array, ctypes.Array]:
    """``capset``'s header and an all-zero data block (every capability dropped), and a block for ``capget``."""
    return (ctypes.create_string_buffer(struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)),
            ctypes.create_string_buffer(struct.pack("=IIIIII", 0, 0, 0, 0, 0, 0)), ctypes.create_string_buffer(24))


def _capset(keep: int) -> None:
    if keep == 0:
        header, data, _ = capset_buffers()
    else:
        header = ctypes.create_string_buffer(struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0))
        data = ctypes.create_string_buffer(struct.pack("=IIIIII", keep, keep, 0, 0, 0, 0))
    if libc.syscall(_SYS_CAPSET, header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def effective_caps() -> int:
    """This process's effective capability set (``capget``; ``CapEff`` of ``/proc/self/status`` elsewhere)."""
    if platform.machine() == "x86_64":
        header, _, data = capset_buffers()
        header.raw = struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0)
        if libc.syscall(_SYS_CAPGET, header, data) == 0:
            low, _, _, high, _, _ = struct.unpack("=IIIIII", data.raw)
            return low | high << 32
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


def confine(*, uid: int | None, scratch_dir: str, read: list[str], network: bool, own_proc: str,
            prepared: dict[str, tuple[int, bool]] | None = None, landlock: int = 0) -> dict[str, str]:
    """Drop privileges, restrict the filesystem and (non-networked) sockets; report what was applied.

    ``prepared`` and ``landlock``: the Landlock rules' paths opened once and the kernel's ABI (``_landlock``)."""
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
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    applied["filesystem"] = _landlock([*read, own_proc], [scratch_dir], list(DEVICE_PATHS), prepared=prepared,
                                      abi=landlock)
    applied["sockets"] = "allowed (networked)" if network else no_sockets()
    die_with_parent()  # changing credentials cleared the parent-death signal
    return applied


# ----------------------------------------------------------------- leftovers


def children(pid: int | None = None) -> list[int]:
    """Live children of ``pid`` (default: this process), read from ``/proc``."""
    out: list[int] = []
    me = pid or host_pid()
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


def reap_children() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def live_pids(pids: list[int]) -> list[int]:
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
    reap_children()
    found = len(live_pids(children()))
    if not found and uid is None:
        return 0
    for _ in range(200):  # a fork bomb keeps spawning while we kill: repeat until quiet
        victims = live_pids(children())
        if uid is not None:
            victims += live_pids([int(e) for e in os.listdir("/proc") if e.isdigit() and _owned_by(e, uid)])
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        reap_children()
        if not victims:
            break
        time.sleep(0.005)
    return found


def _owned_by(pid: str, uid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == uid
    except OSError:
        return False


_parent_pid: int | None = None


def name_process(name: bytes) -> None:
    """The name ``ps`` and ``top`` show for this process (its role in the call), at most 15 bytes."""
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (no orphaned tool runs).

    The parent is the one seen first by this process (``remember_parent``): inside a PID
    namespace a parent outside it reads as 0, and one that died leaves us with the call's
    init (1) as parent, so only a change of ``getppid()`` means "orphaned".
    """
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != (_parent_pid if _parent_pid is not None else os.getppid()) or (
            _parent_pid is None and os.getppid() == 1):
        os._exit(0)


def remember_parent() -> None:
    """Call first thing after a fork: the parent ``die_with_parent`` guards."""
    global _parent_pid
    _parent_pid = os.getppid()


def close_all(fds: Iterable[int]) -> None:
    """Close each descriptor; one already closed is no error."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def host_pid() -> int:
    """This process's pid as the host's ``/proc`` sees it (``getpid`` says 1 inside a PID namespace)."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


#: rlimits a tool process sets on itself, by the names the worker sends them under.
LIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "nofile": resource.RLIMIT_NOFILE,
          "fsize": resource.RLIMIT_FSIZE, "core": resource.RLIMIT_CORE, "nproc": resource.RLIMIT_NPROC}


# ----------------------------------------------------------------- a long-lived command (``executor.sandbox.launch``)

_LANDLOCK_RULE_NET_PORT = 2
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8


def mount_own_proc() -> str:
    """In a PID and mount namespace of this process's own: a fresh ``/proc`` that shows that namespace's pids only."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        return f"unavailable ({exc})"
    return "own-proc"


def tcp_connect_only(ports: tuple[int, ...]) -> str:
    """Landlock (ABI 4+): from now on TCP ``connect`` only to ``ports``, ``bind`` to none (needs ``no_new_privs``)."""
    abi = landlock_abi()
    if abi < 4:
        return f"unavailable (Landlock ABI {abi} has no network rules)"
    attr = struct.pack("=QQ", 0, NET_BIND_TCP | NET_CONNECT_TCP)
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(16), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"unavailable ({errno_text()})"
    try:
        for port in ports:
            rule = struct.pack("=QQ", NET_CONNECT_TCP, port)
            if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_NET_PORT), rule,
                             ctypes.c_uint32(0)) != 0:
                return f"failed ({errno_text()})"
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"failed ({errno_text()})"
    finally:
        os.close(int(ruleset))
    return "tcp-connect " + ",".join(map(str, ports))
