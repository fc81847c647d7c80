"""Isolated tool runs: one OS process per call, limited, timed, scrubbed, disposable.

``Sandbox`` is the boundary; ``ProcessSandbox`` is the implementation. Each call runs in a
tool process of its own (``executor.sandbox.child.tool_process``) in namespaces of the
call's own (mount: only this call's scratch dir is visible; PID: the call's processes die
with it; network: none unless the tool is declared networked; IPC: nothing left for a later
call; user: for non-root workers, so the process limit counts this call alone), with rlimits
on address space, CPU time, open files, file size and core dumps that it sets on itself
before any tool code runs. The environment carries none of the worker's variables; a
wall-clock timeout ends the call and everything it started.

Run as root, each call also gets a uid of its own (``SANDBOX_UID_BASE`` + the tool
process's pid, unique among live processes) and no capability at all; Landlock confines the
filesystem to read-only runtime paths plus the scratch dir, and a seccomp filter refuses
sockets to non-networked tools. Where a layer is unavailable the sandbox degrades and
logs ``sandbox.degraded`` once per layer.

Results come back over a pipe of their own, written only by the call's parent
(``executor.sandbox.parent``, in the fork server or a spawned parent: ``executor.sandbox.serve``), never by
tool code, and read with a cap; stdout and stderr are read with a cap too (the rest is discarded and counted)
and each line becomes a ``tool.output`` log event carrying the call id. A malformed result of any kind is a
typed ``ToolOutputError``.

Starting Python and importing the tool modules costs far more than the tool itself, so
by default a fork server imports them once and is the parent of every call: one fork of it
per call (the tool process) and a ``posix_spawn`` (the call's init). ``warm`` pre-started
children are the fallback; ``bench/sandbox.py`` measures the start, ``bench/sandbox_cpu.py``
the CPU per call by process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from executor.errors import (SandboxError, ToolCpuLimitError, ToolCrashedError, ToolMemoryError, ToolOutputError,
                             ToolRaisedError, ToolTimeoutError)
from executor.sandbox.answer import MAX_FRAME_BYTES, MAX_RESULT_DEPTH, OutputError, decode_object
from executor.sandbox.boundary import CallRun, SandboxResult
from executor.sandbox.call_process import CallProcess, ForkServer, end_call, kill_group, kill_uid, spawn_call_parent
from executor.sandbox.pipes import Captured, collect, log_output
from executor.sandbox.progress import ProgressReader
from tools.registry import default_registry
from tools.spec import ToolSpec
from toolrail.logging import get_logger
from toolrail.settings import get_settings
from toolrail.tracing import adopt_spans

__all__ = ["ProcessSandbox", "SandboxDeniedError", "ScratchRootError", "ToolLeftProcessError", "ToolProcessLimitError",
           "default_scratch_root", "module_search_path", "prepare_scratch_root"]

log = get_logger("toolrail.sandbox")

#: Variables a tool process may see; everything else of the worker's environment is dropped.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
#: Processes (and threads) one call may have at once, the sandbox's own included.
DEFAULT_MAX_PROCESSES = 32


class SandboxDeniedError(SandboxError):
    """The tool tried something the sandbox forbids (a file outside scratch, the network)."""

    type = "sandbox_denied"


class ToolProcessLimitError(SandboxError):
    """The tool tried to start more processes than its limit (a fork bomb)."""

    type = "tool_process_limit"


class ToolLeftProcessError(SandboxError):
    """The tool returned but left processes running; they were killed."""

    type = "tool_left_process"


class ScratchRootError(SandboxError):
    """The scratch root is not a directory of the worker's own with mode 0700: the sandbox refuses to start."""

    type = "sandbox_scratch_root"


# ----------------------------------------------------------------- scratch root and module path


def default_scratch_root() -> Path:
    """``$TMPDIR/toolrail-scratch-<euid>``: one per worker uid, never shared between users."""
    return Path(tempfile.gettempdir()) / f"toolrail-scratch-{os.geteuid()}"


def prepare_scratch_root(path: Path) -> Path:
    """Create the scratch root (mode 0700) or check an existing one; ``ScratchRootError`` if not ours.

    An existing root must be a real directory (not a symlink) owned by this process's uid;
    its mode is set to 0700. Anything else was made by someone else and is refused.
    """
    path = Path(os.path.abspath(path))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ScratchRootError(f"cannot create the sandbox scratch root {path}: {exc}", path=str(path)) from exc
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ScratchRootError(f"the sandbox scratch root {path} is not a directory (a symlink or a file): refusing it",
                               path=str(path))
    if info.st_uid != os.geteuid():
        raise ScratchRootError(f"the sandbox scratch root {path} belongs to uid {info.st_uid}, not to this worker "
                               f"(uid {os.geteuid()}): refusing it; remove it or choose another scratch root",
                               path=str(path), owner=info.st_uid)
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def module_search_path(*, exclude: Path | None = None) -> list[str]:
    """The worker's module search path, as absolute directories, for the tool process to import the same.

    The worker's working directory counts where ``sys.path`` names it (``''``); nothing at
    or below ``exclude`` (the scratch root) is ever passed on.
    """
    out: list[str] = []
    fence = os.path.realpath(exclude) if exclude else None
    for entry in sys.path:
        full = os.path.abspath(entry or os.getcwd())
        if not os.path.exists(full) or full in out:
            continue
        real = os.path.realpath(full)
        if fence and (real == fence or real.startswith(fence + os.sep)):
            continue
        out.append(full)
    return out


def registry_modules() -> str:
    """The modules of every registered tool's entrypoint, comma separated (the fork server preloads them)."""
    modules = {"tools.builtin"}
    modules.update(spec.entrypoint.partition(":")[0] for spec in default_registry().specs() if spec.entrypoint)
    return ",".join(sorted(modules))


# ----------------------------------------------------------------- the sandbox


class ProcessSandbox:
    """Fork-per-call sandbox (a fork server), or spawn-per-call with an optional pool of pre-started children."""

    def __init__(self, *, warm: int = 1, scratch_root: Path | None = None, python: str = sys.executable,
                 preload: str | None = None, own_uid: bool | None = None, confine: bool = True,
                 max_processes: int = DEFAULT_MAX_PROCESSES, forkserver: bool = True,
                 parent_per_call: bool = False, error_tracebacks: bool | None = None) -> None:
        self._warm_target = max(0, warm)
        #: Every tool's failures carry its traceback (``details.traceback``), not only those whose spec asks
        #: (``ToolSpec.error_traceback``); None: ``TOOLRAIL_TOOL_ERROR_TRACEBACKS``.
        self._error_tracebacks = get_settings().tool_error_tracebacks if error_tracebacks is None else error_tracebacks
        #: Fork a call parent per call from the fork server (one more process per call) instead of the
        #: server being every call's parent; what the server does where it cannot own a PID namespace.
        self._parent_per_call = parent_per_call
        self._use_forkserver = forkserver
        self._forkserver: ForkServer | None = None
        self._scratch_root = prepare_scratch_root(scratch_root or default_scratch_root())
        #: A uid of its own per call: only possible (and only needed) as root.
        self._own_uid = os.geteuid() == 0 if own_uid is None else own_uid and os.geteuid() == 0
        if not self._own_uid:
            _warn_once("uid", "sandbox calls run under the worker's uid: the process limit needs a user namespace, "
                              "and files are kept apart by Landlock and the call's own mount namespace",
                       euid=os.geteuid())
        self._confine = confine
        self._max_processes = max_processes
        self._python = python
        self._preload = preload if preload is not None else registry_modules()
        self._pool: deque[CallProcess] = deque()
        self._lock = threading.Lock()
        self._closed = False
        if forkserver:
            self._warm_target = 0  # the fork server replaces the pool of pre-started interpreters
            self._forkserver = ForkServer(self._python, self._env())
        self._refill()

    @property
    def scratch_root(self) -> Path:
        return self._scratch_root

    # -- pool ---------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        env.update({"PYTHONPATH": os.pathsep.join(module_search_path(exclude=self._scratch_root)),
                    "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HOME": str(self._scratch_root),
                    "TOOLRAIL_SANDBOX_PRELOAD": self._preload, "TOOLRAIL_SANDBOX_OWN_UID": "1" if self._own_uid else "0",
                    "TOOLRAIL_SANDBOX_SCRATCH_ROOT": str(self._scratch_root),
                    "TOOLRAIL_SANDBOX_PARENT_PER_CALL": "1" if self._parent_per_call else "0"})
        return env

    def _refill(self) -> None:
        with self._lock:
            while not self._closed and len(self._pool) < self._warm_target:
                self._pool.append(spawn_call_parent(self._python, self._env()))

    def _fork(self, request: bytes) -> CallProcess | None:
        """A call started by the fork server (restarted if it died); None if it cannot serve."""
        for _ in range(2):
            if self._forkserver is None or not self._forkserver.alive():
                if self._forkserver is not None:
                    self._forkserver.close()
                self._forkserver = ForkServer(self._python, self._env())
            try:
                return self._forkserver.fork(request)
            except (OSError, ConnectionError, ValueError) as exc:
                _warn_once("forkserver", "the sandbox fork server failed; restarting it", error=str(exc))
                self._forkserver.close()
                self._forkserver = None
        return None

    def _take(self, request: bytes) -> tuple[CallProcess, bytes]:
        """The call's process, and what is still to be written on its stdin (the request, for a spawned one)."""
        if self._use_forkserver:
            forked = self._fork(request)
            if forked is not None:
                return forked, b""
        with self._lock:
            while self._pool:
                warm = self._pool.popleft()
                if warm.proc.poll() is None:
                    break
                warm.release()
            else:
                warm = None
        if warm is None:
            warm = spawn_call_parent(self._python, self._env())
        # Refill on this thread: children die with the thread that started them
        # (PR_SET_PDEATHSIG), and a spawn is only fork+exec; the imports run in the child.
        self._refill()
        return warm, request

    def close(self) -> None:
        """Kill the warm children and the fork server."""
        if self._forkserver is not None:
            self._forkserver.close()
            self._forkserver = None
        with self._lock:
            self._closed = True
            pool, self._pool = list(self._pool), deque()
        for warm in pool:
            kill_group(warm.proc)
            warm.release()

    # -- one call ------------------------------------------------------------

    def run(self, spec: ToolSpec, call: CallRun) -> SandboxResult:
        """Run one call; every way it can end badly is a ``SandboxError`` subclass (never a stranded job)."""
        try:
            return self._run(spec, call)
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unexpected failure still ends the call with a type
            log.exception("sandbox.failed", tool=spec.name, call_id=call.call_id, job_id=call.job_id)
            raise SandboxError(f"the sandbox failed to run {spec.name}: {type(exc).__name__}: {exc}",
                               exception=type(exc).__name__) from exc

    def _run(self, spec: ToolSpec, call: CallRun) -> SandboxResult:
        scratch = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=self._scratch_root))
        started = time.monotonic()
        streams: dict[str, Captured] = {}
        try:
            request = {
                "entrypoint": spec.entrypoint, "arguments": call.arguments, "tool": spec.name,
                "request_id": call.request_id, "job_id": call.job_id, "call_id": call.call_id,
                "idempotency_key": call.idempotency_key, "scratch_dir": str(scratch),
                "scratch_root": str(self._scratch_root), "limits": _limits(spec, max_processes=self._max_processes),
                "network": spec.networked, "own_uid": self._own_uid, "confine": self._confine,
                "timeout_s": spec.timeout_s, "env": {**call.env, "TOOLRAIL_REQUEST_ID": call.request_id},
                "traceback": bool(getattr(spec, "error_traceback", False) or self._error_tracebacks),
                "trace_context": call.trace_context,
            }
            warm, pending = self._take(json.dumps(request, ensure_ascii=False).encode() + b"\n")
            proc = warm.proc
            try:
                streams = collect(warm.fds, pending, timeout=spec.timeout_s, cancelled=call.cancelled,
                                  progress=ProgressReader.for_call(call, tool=spec.name))
            except subprocess.TimeoutExpired:
                end_call(proc, kill=True)
                raise ToolTimeoutError(f"{spec.name} ran past its {spec.timeout_s:g} s limit and was killed",
                                       timeout_s=spec.timeout_s) from None
            except BaseException:
                end_call(proc, kill=True)  # nothing the tool started outlives the call
                raise
            else:
                end_call(proc)
            finally:
                warm.release()
            frame = _read_frame(spec, streams.get("result"))
            if isinstance(frame, dict) and "spans" in frame:  # the child's spans (it has no network): ours to export
                adopt_spans(frame.pop("spans"), trace_context=call.trace_context)
            isolation = frame.get("isolation") if isinstance(frame, dict) and isinstance(frame.get("isolation"), dict) \
                else {}
            uid = isolation.get("uid")
            if self._own_uid and str(uid).isdigit() and isolation.get("pid") != "pidns":
                kill_uid(int(uid))  # what left the process group (setsid); the end of a PID namespace already killed it
            duration = time.monotonic() - started
            logs = log_output(streams, spec=spec, call=call)
            return self._result(spec, proc, frame, isolation, streams, logs, duration)
        finally:
            try:
                os.rmdir(scratch)  # most calls leave it empty
            except OSError:
                shutil.rmtree(scratch, ignore_errors=True)

    def _result(self, spec: ToolSpec, proc: Any, frame: dict[str, Any] | ToolOutputError | None,
                isolation: dict[str, Any], streams: dict[str, Captured], logs: list[dict[str, Any]],
                duration: float) -> SandboxResult:
        stderr = bytes(streams["stderr"].data) if "stderr" in streams else b""
        died = frame is None or (isinstance(frame, dict) and "exit" in frame and not frame.get("error"))
        if died and self._forkserver is not None and not self._forkserver.alive():
            # the call's process died with the fork server above it: the sandbox's end, not the tool's
            raise SandboxError(f"the sandbox's fork server died while {spec.name} ran; the call did not finish",
                               cause="forkserver_died")
        if frame is None:
            raise _death_error(spec, proc.returncode, stderr)
        if isinstance(frame, ToolOutputError):
            raise frame
        _check_isolation(isolation, confine=self._confine, own_uid=self._own_uid)
        if frame.get("ok") is True and isinstance(frame.get("result"), dict):
            output = {name: {"bytes": c.total, "dropped_bytes": c.dropped} for name, c in streams.items()
                      if name in ("stdout", "stderr")}
            return SandboxResult(result=frame["result"], duration_s=duration, pid=proc.pid,
                                 network=str(frame.get("network", "")), logs=logs, isolation=isolation, output=output)
        if died:
            raise _death_error(spec, frame.get("exit"), stderr)
        raise _tool_failure(frame.get("error") if isinstance(frame.get("error"), dict) else {})


# ----------------------------------------------------------------- limits


def _limits(spec: ToolSpec, *, max_processes: int) -> dict[str, tuple[int, int]]:
    """The rlimits of one call, by name: the tool process sets them on itself before any tool code runs.

    ``nproc`` binds only where the call has a count of its own (its own uid, or a user
    namespace of its own); the tool process drops it otherwise.
    """
    memory = spec.memory_mb * 1024 * 1024
    cpu = int(spec.cpu_s or max(1, int(spec.timeout_s) + 1))  # a fresh fork: its CPU time starts at zero
    return {"as": (memory, memory), "cpu": (cpu, cpu + 1), "nofile": (64, 64),
            "fsize": (16 * 1024 * 1024, 16 * 1024 * 1024), "core": (0, 0), "nproc": (max_processes, max_processes)}


# ----------------------------------------------------------------- how a call ended


_ERRORS: dict[str, type[SandboxError]] = {
    "tool_memory_limit": ToolMemoryError,
    "tool_output_invalid": ToolOutputError,
    "sandbox_denied": SandboxDeniedError,
    "tool_process_limit": ToolProcessLimitError,
    "tool_left_process": ToolLeftProcessError,
    "sandbox_error": SandboxError,
}
_degraded_logged: set[str] = set()


def _read_frame(spec: ToolSpec, raw: Captured | None) -> dict[str, Any] | ToolOutputError | None:
    """The call parent's result frame: None when it wrote none (it died), a ``ToolOutputError`` when malformed."""
    if raw is None or not raw.data:
        return None
    if raw.dropped:
        return ToolOutputError(f"{spec.name}: the sandbox's result frame exceeds its cap", dropped_bytes=raw.dropped)
    try:
        return decode_object(bytes(raw.data), what=f"{spec.name}'s result frame", max_bytes=MAX_FRAME_BYTES,
                             max_depth=MAX_RESULT_DEPTH + 4)
    except OutputError as exc:
        return ToolOutputError(str(exc))


def _tool_failure(error: dict[str, Any]) -> SandboxError:
    """The error a failed call ends with: the type, message and details of the call parent's checked frame, one
    level deep (``{type, message, details}``; a traceback, when asked for, is ``details.traceback``).

    A sandbox outcome (``sandbox_denied``, ``tool_memory_limit``, ...) is its own class; any other type is
    the tool's own (``order_not_found``), carried by a ``ToolRaisedError`` (the call parent refused the
    types a tool may not claim: ``executor.sandbox.answer.tool_error_type``).
    """
    kind = str(error.get("type") or "tool_error")
    cls = _ERRORS.get(kind, ToolRaisedError)
    failure = cls(str(error.get("message", "tool failed")))
    failure.details = dict(error.get("details") or {})  # set, not passed: a tool's detail may be named ``message``
    if cls is ToolRaisedError:
        failure.type = kind
    return failure


def _death_error(spec: ToolSpec, returncode: int | None, stderr: bytes) -> SandboxError:
    tail = stderr[-600:].decode(errors="replace")
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return ToolCpuLimitError(f"{spec.name} used more than its CPU time limit", signal="SIGXCPU")
        if sig == signal.SIGKILL and "MemoryError" in tail:
            return ToolMemoryError(f"{spec.name} exceeded its {spec.memory_mb} MB memory limit")
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return ToolCrashedError(f"{spec.name} died of {name}", signal=name, stderr_tail=tail)
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return ToolMemoryError(f"{spec.name} exceeded its {spec.memory_mb} MB memory limit", stderr_tail=tail)
    return ToolCrashedError(f"{spec.name} exited with status {returncode} without a result", exit_status=returncode,
                            stderr_tail=tail)


def _warn_once(what: str, message: str, **details: Any) -> None:
    if what not in _degraded_logged:
        _degraded_logged.add(what)
        log.warning("sandbox.degraded", layer=what, message=message, **details)


#: Isolation layers by the values that say the tool process applied them, and what it means when it did not.
_NAMESPACES = (
    ("network", ("netns", "userns+netns", "allowed"), "no network namespace: non-networked tools can reach the network"),
    ("scratch", ("own-mount",), "no mount namespace: other calls' scratch dirs are kept apart by modes and Landlock only"),
    ("ipc", ("ipcns",), "no IPC namespace: System V IPC and message queues are shared between calls"),
    ("pid", ("pidns",), "no PID namespace: leftover processes are found through the subreaper only"))
_CONFINEMENT = (("filesystem", ("landlock",), "no Landlock: tools can read what their uid can read"),
                ("sockets", ("seccomp", "allowed"), "no seccomp: non-networked tools can open Unix sockets"))


def _check_isolation(isolation: dict[str, Any], *, confine: bool, own_uid: bool) -> None:
    """Log (once per layer and process) any isolation layer the child could not apply."""
    def warn_missing(layers: tuple[tuple[str, tuple[str, ...], str], ...]) -> None:
        for layer, applied, message in layers:
            how = str(isolation.get(layer, ""))
            if how and not how.startswith(applied):
                _warn_once(layer, message, how=how)

    warn_missing(_NAMESPACES)
    if str(isolation.get("processes", "")).startswith("unlimited"):
        _warn_once("processes", "no per-call process limit (needs root or a user namespace)",
                  how=isolation.get("processes"))
    if not confine:
        return
    warn_missing(_CONFINEMENT)
    if own_uid and isolation.get("uid") and not str(isolation.get("uid")).isdigit():
        _warn_once("uid_drop", "the tool process kept the worker's uid", how=isolation.get("uid"))
