"""The sandboxed side of a tool run: the tool process, what it may read, and how its failures are classified.

The Linux primitives it is confined with (namespaces, Landlock, seccomp, capabilities, rlimits,
prctl, leftovers) are in ``executor.sandbox.linux``; this module decides which to apply, in order.

``python -m executor.sandbox.serve --forkserver FD`` runs the fork server
(``executor.sandbox.serve.serve_forks``); without it, one spawned call parent serves one call
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
import errno
import functools
import importlib
import importlib.util
import inspect
import json
import linecache
import os
import resource
import sys
import time
import traceback
from typing import Any

from executor.sandbox.answer import encode_result, error_frame, tool_error_type
from executor.sandbox.linux import (LIMITS, confine, die_with_parent, drop_network, enter_user_namespace, hide_other_calls,
                                    host_pid, make_reachable, name_process, own_ipc, private_mounts, remember_parent)
from executor.sandbox.prepared import (empty_network_fd, enter_empty_network, landlock_abi_prepared, prepared_fds,
                                       prepared_rules, release_prepared, require_no_sockets)
from tools.context import CallContext, flush_progress, set_current_call

#: The descriptor a spawned call parent writes its one result frame to; the tool process never holds it.
RESULT_FD = 3
#: Per-call uids start here (root only): uid = base + the tool process's pid, unique among live processes.
SANDBOX_UID_BASE = 1_000_000
#: The call's progress pipe: the tool process writes ``report_progress`` lines to it (``tools.context``), the
#: worker reads them as they come (``executor.sandbox.progress``), as untrusted as anything the tool writes.
PROGRESS_FD = 4

#: Non-secret system files a Python tool may need (loader cache, time zone, resolver, CA certs).
SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime",
                     "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf",
                     "/etc/services", "/etc/protocols", "/etc/ssl", "/etc/ca-certificates", "/etc/pki")
#: Packages of this platform a tool imports through ``tools.context`` and friends.
PLATFORM_PACKAGES = ("toolrail", "tools", "executor")


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
    paths.update(found for name in (*PLATFORM_PACKAGES, *modules) for found in _package_dir(name.split(".", 1)[0]))
    paths.update(SYSTEM_READ_PATHS)
    fenced = [os.path.realpath(p) for p in exclude if p]

    def allowed(path: str) -> bool:
        real = os.path.realpath(path)
        return real != "/" and not any(real == f or real.startswith(f + os.sep) or f.startswith(real + os.sep)
                                       for f in fenced)

    return tuple(sorted(p for p in paths if allowed(p)))


# ----------------------------------------------------------------- the tool process


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


def raised_by_statement(exc: BaseException) -> bool:
    """Whether Python code raised ``exc`` itself (a ``raise`` statement is its innermost frame's line), rather than
    the interpreter or a C extension failing an operation (an allocation, a system call)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).lstrip()
    return line.startswith("raise") and not line[5:6].isidentifier()


def classify(exc: BaseException) -> dict:
    """The typed error of a tool exception: the sandbox's refusals get types of their own — only when the sandbox
    caused them. A ``MemoryError`` or ``PermissionError`` the tool raises itself (``raise PermissionError("refunds
    need a manager")``) is the tool's ``tool_error``; ``tool_memory_limit`` is an allocation that failed under the
    sandbox's limit, ``sandbox_denied`` a system call it refused (``errno`` EACCES/EPERM)."""
    by_tool = raised_by_statement(exc)
    if isinstance(exc, MemoryError) and not by_tool:
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
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM) and not by_tool:
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


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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
    if not request.get("network") and request.get("confine", True) and empty_network_fd() is not None:
        # the worker's empty one, entered with the fork server's capabilities (before a user namespace of our own);
        # only a confined call, whose socket filter ``require_no_sockets`` then insists on. Where this process may
        # not enter it (a call parent of its own user namespace), the call makes its own below, as without it
        if enter_empty_network() == "netns":
            setup["network"], setup["network_ns"] = "netns", "shared"
    if os.geteuid() != 0:
        setup["userns"] = enter_user_namespace()
        if setup["userns"] == "userns" and "nproc" in limits:
            setup["processes"] = f"{limits['nproc'][0]} per call (user namespace)"
        else:
            limits.pop("nproc", None)  # without a namespace of its own the count would be the worker's whole uid
    elif request.get("own_uid"):
        uid = SANDBOX_UID_BASE + host_pid()
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
    if "network" not in setup:
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
    keep = sorted({answer_fd, *prepared_fds(), *([PROGRESS_FD] if _progress_pipe else [])})
    for low, high in zip([RESULT_FD, *(fd + 1 for fd in keep)], [*keep, 1 << 16]):
        os.closerange(low, high)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    die_with_parent()

    ids = {"request_id": request["request_id"], "job_id": request["job_id"], "call_id": request["call_id"],
           "tool": request["tool"]}
    isolation: dict[str, str] = {}
    try:
        request, isolation = tool_namespaces(request)
        module_name, _, func_name = request["entrypoint"].partition(":")
        func = getattr(importlib.import_module(module_name), func_name)
        _bind_tool_logging(ids)
        if request.get("confine", True):
            read = read_paths([*modules, request["entrypoint"].partition(":")[0]],
                              exclude=[request.get("scratch_root", "")])
            isolation.update(confine(uid=request.get("uid"), scratch_dir=request["scratch_dir"], read=read,
                                     network=bool(request.get("network")), own_proc=f"/proc/{host_pid()}",
                                     prepared=prepared_rules(), landlock=landlock_abi_prepared()))
            require_no_sockets(isolation)
        release_prepared()  # confined or not, the tool never holds the fork server's descriptors
        os.environ.update({**request.get("env", {}), "TMPDIR": request["scratch_dir"], "HOME": request["scratch_dir"]})
        os.chdir(request["scratch_dir"])
    except Exception as exc:  # noqa: BLE001 - a sandbox that cannot be set up must not run the tool
        write_all(answer_fd, json.dumps({"isolation": isolation}).encode() + b"\n")
        write_all(answer_fd, json.dumps(error_frame("sandbox_error", f"sandbox setup failed: {type(exc).__name__}: {exc}",
                                                exception=type(exc).__name__)).encode())
        os._exit(0)
    write_all(answer_fd, json.dumps({"isolation": isolation}).encode() + b"\n")  # the last line the sandbox writes
    _emit("tool.start", ids, pid=host_pid(), **{f"isolation_{k}": v for k, v in isolation.items()})
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
        write_all(answer_fd, encode_result(payload))
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # interpreter teardown would only delay the call parent


def mark_progress_pipe(present: bool) -> None:
    """This tool process holds the call's progress pipe at ``PROGRESS_FD`` (a fork server's call: set by its parent)."""
    global _progress_pipe
    _progress_pipe = present


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


def reachable_for_own_uid(modules: list[str]) -> None:
    """As root with per-call uids: once per process (inherited by forks), ``make_reachable`` what tools read."""
    global _reachable_done
    if _reachable_done or os.geteuid() != 0 or os.environ.get("TOOLRAIL_SANDBOX_OWN_UID") != "1":
        return
    _reachable_done = True
    with contextlib.suppress(OSError):
        private_mounts()
        make_reachable(read_paths(modules))
