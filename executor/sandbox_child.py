"""The sandboxed side of a tool run: ``python -m executor.sandbox_child NONCE``.

Started (often ahead of time) by ``executor.sandbox``; imports the common tool modules,
then blocks on one JSON request line on stdin. The parent sets rlimits on this process
*before* writing that line, so no tool code runs unlimited. Then, in this order:

1. drop the network namespace unless the tool is networked (needs privilege: done first);
2. import the tool's module (registry code, trusted) while the interpreter can still read it;
3. confine (``confine``): become the call's own unprivileged uid when the parent asks
   (root: ``RLIMIT_NPROC`` only binds a non-root uid, and a uid of its own means the
   call's processes can be counted and killed as one), keep at most
   ``CAP_DAC_READ_SEARCH`` (only when the interpreter is not readable by others), set
   ``no_new_privs``, and restrict the filesystem with Landlock: read-only on the
   interpreter, its libraries and the tool packages, read-write on the scratch dir only;
4. enter the scratch dir, run the tool, then look for processes the tool left behind
   (this process is their child subreaper): any found are killed and the call fails
   with ``tool_left_process``.

The tool's own prints go to stderr; logs are JSON lines on stderr carrying
``request_id``; one result line tagged with the nonce goes to the original stdout.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import importlib.util
import inspect
import json
import os
import signal
import stat
import struct
import sys
import time
import traceback

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MAX_RESULT_BYTES = 1_000_000

PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CAP_DAC_READ_SEARCH = 2
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
#: Packages of this platform a tool imports through ``tools.context`` and friends.
PLATFORM_PACKAGES = ("toolrail", "tools", "executor")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def drop_network() -> str:
    """Enter a fresh network namespace (no interfaces but a down loopback). Returns how."""
    if _libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return f"unavailable (errno {ctypes.get_errno()})"


# ----------------------------------------------------------------- confinement


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
        return f"unavailable (errno {ctypes.get_errno()})"
    handled = _fs_rights(abi)
    ruleset = -1
    if abi >= 6:  # also forbid signals and abstract sockets towards anything outside the sandbox
        attr = ctypes.create_string_buffer(struct.pack("=QQQ", handled, 0, _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET))
        ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(24), ctypes.c_uint32(0))
    if ruleset < 0:
        attr = ctypes.create_string_buffer(struct.pack("=Q", handled))
        ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"unavailable (errno {ctypes.get_errno()})"
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    try:
        for paths, access in ((read_paths, read), (write_paths, handled),
                              (device_paths, FS_READ_FILE | FS_WRITE_FILE)):
            for path in paths:
                _add_rule(int(ruleset), path, access & handled)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"failed (errno {ctypes.get_errno()})"
    finally:
        os.close(int(ruleset))
    return f"landlock-v{abi}"


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


def _readable_by_others(path: str) -> bool:
    """Whether an unprivileged uid can reach ``path`` (every parent searchable, the file readable)."""
    current = os.path.abspath(path)
    try:
        if not os.stat(current).st_mode & stat.S_IROTH:
            return False
        while True:
            parent = os.path.dirname(current)
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == current:
                return True
            current = parent
    except OSError:
        return False


def _package_dirs(modules: list[str]) -> list[str]:
    out = []
    for name in modules:
        top = name.split(".", 1)[0]
        try:
            found = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if found is None:
            continue
        if found.submodule_search_locations:
            out.extend(found.submodule_search_locations)
        elif found.origin and os.path.isfile(found.origin):
            out.append(found.origin)
    return out


def read_paths(modules: list[str]) -> list[str]:
    """What a tool may read: the interpreter, its libraries, site-packages, the tool packages, system libs."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    repo_roots = {os.path.dirname(p) for p in _package_dirs(list(PLATFORM_PACKAGES))}
    for entry in sys.path:
        if entry and os.path.isdir(entry) and os.path.abspath(entry) not in repo_roots:
            paths.add(os.path.abspath(entry))  # stdlib, lib-dynload, site-packages; never the whole repo
    paths.update(_package_dirs([*PLATFORM_PACKAGES, *modules]))
    paths.update(SYSTEM_READ_PATHS)
    return sorted(paths)


def _capset(keep: int) -> None:
    header = ctypes.create_string_buffer(struct.pack("=Ii", _LINUX_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(struct.pack("=IIIIII", keep, keep, 0, 0, 0, 0))
    if _libc.syscall(_SYS_CAPSET, header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def confine(*, uid: int | None, scratch_dir: str, modules: list[str]) -> dict[str, str]:
    """Drop privileges and restrict the filesystem; report what was applied."""
    applied: dict[str, str] = {}
    keep_caps = 0
    if uid is not None and os.geteuid() == 0:
        # The interpreter may live under a root-only directory (/root/.pyenv): then keep
        # CAP_DAC_READ_SEARCH alone, and let Landlock decide what may actually be read.
        if not _readable_by_others(sys.executable) or not _readable_by_others(os.__file__):
            keep_caps = 1 << CAP_DAC_READ_SEARCH
        _libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        _capset(keep_caps)
        _libc.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)
        applied["uid"] = str(uid)
        applied["caps"] = "dac_read_search" if keep_caps else "none"
    else:
        applied["uid"] = "unchanged (not root)" if os.geteuid() != 0 else "unchanged (not asked)"
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    own_proc = f"/proc/{os.getpid()}"  # to find the tool's leftover children afterwards
    applied["filesystem"] = _landlock([*read_paths(modules), own_proc], [scratch_dir],
                                      ["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"])
    die_with_parent()  # changing credentials cleared the parent-death signal
    return applied


# ----------------------------------------------------------------- leftovers


def _children() -> list[int]:
    """Live children of this process (its own ``/proc`` entry stays readable under Landlock)."""
    out: list[int] = []
    me = os.getpid()
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


def kill_leftovers(own_uid: bool) -> int:
    """Kill every process the tool left; returns how many were found (at least 1 if any).

    Every live descendant is a child of this process or below one: orphans reparent here
    (child subreaper), even after ``setsid``. With a uid of its own, ``kill(-1, SIGKILL)``
    reaches all of them at once; without, children are killed round by round as their
    own children reparent here. The parent sweeps the call's uid once more afterwards.
    """
    _reap()
    first = set(_children())
    _reap()  # a child that exited between the two looks is a zombie, not a leftover
    found = len(first & set(_children()))
    if not found:
        return 0
    for _ in range(200):  # a fork bomb keeps spawning while we kill: repeat until quiet
        if own_uid:
            try:
                os.kill(-1, signal.SIGKILL)  # every process of this call's own uid, except this one
            except OSError:
                pass
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)
        _reap()
        if not _children():
            break
    return found


# ----------------------------------------------------------------- the call


def _emit(nonce: str, payload: dict, out) -> None:
    line = json.dumps(payload, ensure_ascii=False, default=str)
    if len(line) > MAX_RESULT_BYTES:
        line = json.dumps({"ok": False, "error": {"type": "tool_output_invalid",
                                                  "message": f"result of {len(line)} bytes exceeds {MAX_RESULT_BYTES}"}})
    out.write(f"\x00TOOLRAIL-RESULT {nonce} {line}\n")
    out.flush()


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
    if callable(to_dict):
        return to_dict()
    name = type(exc).__name__
    details = {"exception": name}
    if isinstance(exc, BlockingIOError) and exc.errno == errno.EAGAIN and "fork" in traceback.format_exc():
        return {"type": "tool_process_limit", "message": f"the tool hit its process limit: {exc}", "details": details}
    if isinstance(exc, PermissionError) or (isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM)):
        return {"type": "sandbox_denied", "message": f"the sandbox denied an operation: {name}: {exc}",
                "details": {**details, "filename": getattr(exc, "filename", None)}}
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL):
        return {"type": "sandbox_denied", "message": f"the tool has no network: {name}: {exc}", "details": details}
    return {"type": "tool_error", "message": f"{name}: {exc}", "details": details}


def die_with_parent() -> None:
    """SIGKILL this process when the worker that started it dies (no orphaned tool runs)."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(0)


def main(argv: list[str]) -> int:
    nonce = argv[1] if len(argv) > 1 else ""
    die_with_parent()
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # the tool's orphans come back to us, to be found
    result_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the tool's prints land on stderr, never in the result channel
    sys.stdout = sys.stderr
    preload = [m for m in os.environ.get("TOOLRAIL_SANDBOX_PRELOAD", "tools.builtin").split(",") if m]
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a broken preload must not kill the pool
            pass
    import structlog  # noqa: PLC0415 - after preload, before the request

    from tools.context import CallContext, set_current_call  # noqa: PLC0415

    line = sys.stdin.readline()
    if not line:
        return 0
    request = json.loads(line)
    me = os.getpid()
    network = "allowed" if request.get("network") else drop_network()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                                    structlog.processors.JSONRenderer(ensure_ascii=False)],
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request["request_id"], job_id=request["job_id"],
                                           call_id=request["call_id"], tool=request["tool"])
    log = structlog.get_logger("toolrail.sandbox")
    isolation: dict[str, str] = {"network": network}
    try:
        func = _load(request["entrypoint"])
        if request.get("confine", True):
            isolation.update(confine(uid=request.get("uid"), scratch_dir=request["scratch_dir"],
                                     modules=[*preload, request["entrypoint"].partition(":")[0]]))
    except Exception as exc:  # noqa: BLE001 - a sandbox that cannot be set up must not run the tool
        _emit(nonce, {"ok": False, "error": {"type": "sandbox_error", "message": f"sandbox setup failed: {exc}",
                                             "details": {"exception": type(exc).__name__}}, "isolation": isolation},
              result_out)
        return 0
    os.environ.update(request.get("env", {}))
    os.chdir(request["scratch_dir"])
    log.info("tool.start", pid=me, network=network, **{f"isolation_{k}": v for k, v in isolation.items() if k != "network"})
    set_current_call(CallContext(request_id=request["request_id"], job_id=request["job_id"], call_id=request["call_id"],
                                 idempotency_key=request["idempotency_key"], scratch_dir=request["scratch_dir"]))
    try:
        result = _call(func, request["arguments"])
        json.dumps(result, default=str)
        payload = {"ok": True, "result": result, "network": network}
    except BaseException as exc:  # noqa: BLE001 - every tool failure becomes a typed result
        if os.getpid() != me:
            os._exit(1)  # a process the tool forked unwound to here: it reports nothing
        error = classify(exc)
        error.setdefault("details", {})["traceback"] = traceback.format_exc(limit=5)[-2000:]
        payload = {"ok": False, "error": error}
    if os.getpid() != me:
        os._exit(0)  # a forked copy of the tool returned: only the sandbox's own process reports
    left = kill_leftovers(own_uid=isolation.get("uid", "").isdigit())
    if left:
        log.warning("tool.left_processes", count=left)
        if payload["ok"] or payload["error"].get("type") == "tool_error":
            payload = {"ok": False, "error": {"type": "tool_left_process", "message":
                       f"the tool left {left} process(es) running after it returned; they were killed",
                       "details": {"processes": left}}}
    payload["network"] = network
    payload["isolation"] = isolation
    log.info("tool.end", ok=payload["ok"])
    _emit(nonce, payload, result_out)
    # Leave at once: the result is out, and interpreter teardown (hundreds of modules) only
    # delays the EOF the worker waits for.
    sys.stderr.flush()
    os._exit(0)


def serve_forks(sock_fd: int) -> int:
    """Fork server ("zygote"): import once, then fork one fresh child per call.

    Protocol on the Unix socket shared with one worker process, one call at a time:
    the worker sends its nonce with three fds (the call's stdin, stdout, stderr pipes);
    we fork, answer ``pid <pid>``, wait for the child and answer ``exit <pid> <status>``.
    The child becomes exactly what a freshly spawned sandbox child is after its imports —
    its own session, fds 0/1/2 on the call's pipes — and runs ``main``. Forking a
    pre-imported process costs milliseconds where starting an interpreter and importing
    the tool modules costs hundreds (bench/sandbox.py).
    """
    import socket  # noqa: PLC0415

    die_with_parent()
    for module in [m for m in os.environ.get("TOOLRAIL_SANDBOX_PRELOAD", "tools.builtin").split(",") if m]:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a broken preload must not kill the server
            pass
    import structlog  # noqa: F401, PLC0415 - preloaded for the children

    import tools.context  # noqa: F401, PLC0415

    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, 256, 3)
        except OSError:
            return 0
        if not message or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return 0
        nonce = message.decode(errors="replace").strip()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                os.setsid()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                code = main(["sandbox_child", nonce])
            finally:
                os._exit(code or 0)
        for fd in fds:
            os.close(fd)
        try:
            sock.sendall(f"pid {pid}\n".encode())
            _, status = os.waitpid(pid, 0)
            sock.sendall(f"exit {pid} {status}\n".encode())
        except OSError:
            return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--forkserver":
        sys.exit(serve_forks(int(sys.argv[2])))
    sys.exit(main(sys.argv))
