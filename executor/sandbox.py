"""Isolated tool runs: one OS process per call, limited, timed, scrubbed, disposable.

``Sandbox`` is the boundary; ``ProcessSandbox`` is the implementation. Each call gets a
child process (``executor.sandbox_child``) in its own session with rlimits on address
space, CPU time, open files, file size and core dumps, a scratch working directory, an
environment that carries none of the worker's variables, a fresh network namespace
unless the tool is declared networked, and a wall-clock kill of its whole process group.

Run as root, each call also gets a uid of its own (``SANDBOX_UID_BASE`` + the child's
pid, unique among live processes): ``RLIMIT_NPROC`` binds (it never binds uid 0), the
call's processes can be found and killed as one even when they left the process group,
and the worker's files and ``/proc/<pid>/environ`` are out of reach. Landlock (where the
kernel has it) confines the filesystem to read-only runtime paths plus the scratch dir.
Where a layer is unavailable the sandbox degrades and logs ``sandbox.degraded`` once.

Starting Python and importing the tool modules costs far more than the tool itself, so
the sandbox keeps ``warm`` children started ahead of time, limits not yet applied and no
request read. A warm child serves exactly one call and exits: isolation is unchanged,
the start-up cost moves off the critical path (``bench/sandbox.py`` measures it).
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from executor.errors import (
    SandboxError,
    ToolCpuLimitError,
    ToolCrashedError,
    ToolMemoryError,
    ToolOutputError,
    ToolRaisedError,
    ToolTimeoutError,
)
from toolrail.logging import get_logger
from tools.spec import ToolSpec

__all__ = [
    "CallRun",
    "ProcessSandbox",
    "SANDBOX_UID_BASE",
    "Sandbox",
    "SandboxDeniedError",
    "SandboxResult",
    "ToolLeftProcessError",
    "ToolProcessLimitError",
]

log = get_logger("toolrail.sandbox")

#: Variables a tool process may see; everything else of the worker's environment is dropped.
PASSTHROUGH_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
RESULT_MARK = "\x00TOOLRAIL-RESULT "
MAX_LOG_BYTES = 256_000
#: Per-call uids start here (root only): uid = base + pid of the sandbox child.
SANDBOX_UID_BASE = 1_000_000
#: Processes (and threads) one call may have at once, the sandbox child included.
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


_ERRORS: dict[str, type[SandboxError]] = {
    "tool_memory_limit": ToolMemoryError,
    "tool_output_invalid": ToolOutputError,
    "sandbox_denied": SandboxDeniedError,
    "tool_process_limit": ToolProcessLimitError,
    "tool_left_process": ToolLeftProcessError,
    "sandbox_error": SandboxError,
}
_degraded_logged: set[str] = set()


@dataclass(frozen=True)
class CallRun:
    """What the sandbox needs to know about one call."""

    request_id: str
    job_id: str
    call_id: str
    idempotency_key: str
    arguments: dict[str, Any]
    #: Extra variables granted to this tool (e.g. the ledger URL for networked tools).
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxResult:
    result: Any
    duration_s: float
    pid: int
    network: str
    logs: list[dict[str, Any]]
    isolation: dict[str, str] = field(default_factory=dict)


class Sandbox(Protocol):
    def run(self, spec: ToolSpec, call: CallRun) -> SandboxResult:
        """Run one call; raise a ``SandboxError`` subclass when it ends badly."""
        ...


@dataclass
class _Warm:
    proc: Any  # subprocess.Popen, or _ForkedCall from the fork server: same surface
    nonce: str
    started: float


class _ForkedCall:
    """A sandbox child forked by the fork server, with the parts of ``Popen`` the sandbox uses."""

    def __init__(self, server: "_ForkServer", pid: int, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> None:
        self._server = server
        self.pid = pid
        self.returncode: int | None = None
        self._stdin: int | None = stdin_fd
        self._readers = {stdout_fd: bytearray(), stderr_fd: bytearray()}
        self._order = (stdout_fd, stderr_fd)
        self._open = {stdout_fd, stderr_fd}

    def poll(self) -> int | None:
        return self.returncode

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple[bytes, bytes]:  # noqa: A002
        import selectors  # noqa: PLC0415

        deadline = None if timeout is None else time.monotonic() + timeout
        if self._stdin is not None:
            try:
                if input:
                    os.write(self._stdin, input)
            except BrokenPipeError:
                pass
            finally:
                os.close(self._stdin)
                self._stdin = None
        with selectors.DefaultSelector() as selector:
            for fd in self._open:
                selector.register(fd, selectors.EVENT_READ)
            while self._open:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired("sandbox child", timeout or 0)
                for key, _ in selector.select(remaining):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        self._readers[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
                        os.close(key.fd)
                        self._open.discard(key.fd)
        self.wait(timeout=None if deadline is None else max(0.5, deadline - time.monotonic()))
        return bytes(self._readers[self._order[0]]), bytes(self._readers[self._order[1]])

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.wait_exit(self.pid, timeout=timeout)
        return self.returncode

    def close(self) -> None:
        for fd in list(self._open) + ([self._stdin] if self._stdin is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass
        self._open.clear()
        self._stdin = None


class _ForkServer:
    """One pre-imported ``sandbox_child --forkserver`` process per worker process."""

    def __init__(self, python: str, env: dict[str, str], cwd: str) -> None:
        import socket  # noqa: PLC0415

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._buffer = b""
        self.proc = subprocess.Popen([python, "-m", "executor.sandbox_child", "--forkserver", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
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

    def fork(self, nonce: str, *, timeout: float = 30.0) -> _ForkedCall:
        import socket  # noqa: PLC0415

        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            socket.send_fds(self._sock, [nonce.encode()], [in_r, out_w, err_w])
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        try:
            kind, pid = self._line(timeout).split()[:2]
        except (OSError, ValueError):
            for fd in (in_w, out_r, err_r):
                os.close(fd)
            raise
        if kind != "pid":
            raise ConnectionError(f"unexpected fork server reply {kind!r}")
        return _ForkedCall(self, int(pid), in_w, out_r, err_r)

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
            _kill_group(self.proc)


class ProcessSandbox:
    """Spawn-per-call sandbox with an optional pool of pre-started children."""

    def __init__(self, *, warm: int = 1, scratch_root: Path | None = None, python: str = sys.executable,
                 preload: str = "tools.builtin", own_uid: bool | None = None, confine: bool = True,
                 max_processes: int = DEFAULT_MAX_PROCESSES, forkserver: bool = True) -> None:
        self._warm_target = max(0, warm)
        self._use_forkserver = forkserver
        self._forkserver: _ForkServer | None = None
        self._scratch_root = scratch_root or Path(tempfile.gettempdir()) / "toolrail-scratch"
        self._scratch_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self._scratch_root, 0o711)  # per-call uids traverse it, only root lists it
        #: A uid of its own per call: only possible (and only needed) as root.
        self._own_uid = os.geteuid() == 0 if own_uid is None else own_uid and os.geteuid() == 0
        if not self._own_uid:
            _warn_once("uid", "sandbox calls run under the worker's uid: RLIMIT_NPROC does not bind root, and leftover "
                              "processes are found by process group and subreaper only", euid=os.geteuid())
        self._confine = confine
        self._max_processes = max_processes
        self._python = python
        self._preload = preload
        self._pool: deque[_Warm] = deque()
        self._lock = threading.Lock()
        self._closed = False
        if forkserver:
            self._warm_target = 0  # the fork server replaces the pool of pre-started interpreters
            self._forkserver = _ForkServer(self._python, self._env(), str(self._scratch_root))
        self._refill()

    # -- pool ---------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        root = str(Path(__file__).resolve().parent.parent)
        env.update({"PYTHONPATH": root, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                    "HOME": str(self._scratch_root), "TOOLRAIL_SANDBOX_PRELOAD": self._preload})
        return env

    def _spawn(self) -> _Warm:
        nonce = secrets.token_hex(8)
        proc = subprocess.Popen(
            [self._python, "-m", "executor.sandbox_child", nonce],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self._env(), cwd=str(self._scratch_root), start_new_session=True, close_fds=True,
        )
        return _Warm(proc, nonce, time.monotonic())

    def _refill(self) -> None:
        with self._lock:
            while not self._closed and len(self._pool) < self._warm_target:
                self._pool.append(self._spawn())

    def _fork(self) -> _Warm | None:
        """A child from the fork server (restarted if it died); None if it cannot serve."""
        for _ in range(2):
            if self._forkserver is None or not self._forkserver.alive():
                if self._forkserver is not None:
                    self._forkserver.close()
                self._forkserver = _ForkServer(self._python, self._env(), str(self._scratch_root))
            nonce = secrets.token_hex(8)
            try:
                return _Warm(self._forkserver.fork(nonce), nonce, time.monotonic())
            except (OSError, ConnectionError) as exc:
                _warn_once("forkserver", "the sandbox fork server failed; restarting it", error=str(exc))
                self._forkserver.close()
                self._forkserver = None
        return None

    def _take(self) -> _Warm:
        if self._use_forkserver:
            forked = self._fork()
            if forked is not None:
                return forked
        with self._lock:
            while self._pool:
                warm = self._pool.popleft()
                if warm.proc.poll() is None:
                    break
            else:
                warm = None
        if warm is None:
            warm = self._spawn()
        # Refill on this thread: children die with the thread that started them
        # (PR_SET_PDEATHSIG), and a spawn is only fork+exec; the imports run in the child.
        self._refill()
        return warm

    def close(self) -> None:
        """Kill the warm children and the fork server."""
        if self._forkserver is not None:
            self._forkserver.close()
            self._forkserver = None
        with self._lock:
            self._closed = True
            pool, self._pool = list(self._pool), deque()
        for warm in pool:
            _kill_group(warm.proc)

    # -- one call ------------------------------------------------------------

    def run(self, spec: ToolSpec, call: CallRun) -> SandboxResult:
        warm = self._take()
        proc = warm.proc
        scratch = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=self._scratch_root))
        started = time.monotonic()
        uid = SANDBOX_UID_BASE + proc.pid if self._own_uid else None
        try:
            if uid is not None:
                os.chown(scratch, uid, uid)
                os.chmod(scratch, 0o700)
            _apply_limits(proc.pid, spec, max_processes=self._max_processes if uid is not None else None,
                          forked=isinstance(proc, _ForkedCall))
            request = {
                "entrypoint": spec.entrypoint, "arguments": call.arguments, "tool": spec.name,
                "request_id": call.request_id, "job_id": call.job_id, "call_id": call.call_id,
                "idempotency_key": call.idempotency_key, "scratch_dir": str(scratch),
                "network": spec.networked, "uid": uid, "confine": self._confine, "env": {**call.env, "TOOLRAIL_REQUEST_ID": call.request_id,
                                                   "TMPDIR": str(scratch), "HOME": str(scratch)},
            }
            try:
                stdout, stderr = proc.communicate(json.dumps(request, ensure_ascii=False).encode() + b"\n",
                                                  timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                if uid is not None:
                    _kill_uid(uid)
                try:
                    proc.communicate(timeout=2)
                except subprocess.TimeoutExpired:
                    pass  # a process that escaped every kill still holds the pipes: stop reading them
                raise ToolTimeoutError(f"{spec.name} ran past its {spec.timeout_s:g} s limit and was killed",
                                       timeout_s=spec.timeout_s) from None
            finally:
                _kill_group(proc)  # nothing the tool started outlives the call
                if uid is not None:
                    _kill_uid(uid)  # not even what left the process group (setsid)
            duration = time.monotonic() - started
            logs = _parse_logs(stderr)
            payload = _parse_result(stdout, warm.nonce)
            if payload is None:
                raise _death_error(spec, proc.returncode, stderr)
            isolation = payload.get("isolation") or {}
            _check_isolation(isolation, own_uid=uid is not None, confine=self._confine)
            if not payload.get("ok"):
                error = payload.get("error") or {}
                cls = _ERRORS.get(error.get("type", ""), ToolRaisedError)
                exc = cls(error.get("message", "tool failed"), tool_error=error)
                raise exc
            return SandboxResult(result=payload.get("result"), duration_s=duration, pid=proc.pid,
                                 network=payload.get("network", ""), logs=logs, isolation=isolation)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _warn_once(what: str, message: str, **details: Any) -> None:
    if what not in _degraded_logged:
        _degraded_logged.add(what)
        log.warning("sandbox.degraded", layer=what, message=message, **details)


def _check_isolation(isolation: dict[str, str], *, own_uid: bool, confine: bool) -> None:
    """Log (once per layer and process) any isolation layer the child could not apply."""
    network = isolation.get("network", "")
    if network.startswith("unavailable"):
        _warn_once("network", "no network namespace: non-networked tools can reach the network", how=network)
    filesystem = isolation.get("filesystem", "")
    if confine and filesystem and not filesystem.startswith("landlock"):
        _warn_once("filesystem", "no Landlock: tools can read what their uid can read", how=filesystem)
    if own_uid and confine and not isolation.get("uid", "").isdigit():
        _warn_once("uid_drop", "the tool process kept the worker's uid", how=isolation.get("uid"))


def _kill_uid(uid: int) -> None:
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


def _apply_limits(pid: int, spec: ToolSpec, *, max_processes: int | None = None, forked: bool = False) -> None:
    """rlimits on the (waiting) child, before it reads its request."""
    memory = spec.memory_mb * 1024 * 1024
    # a spawned child already spent ~1 s of CPU starting the interpreter; a forked one starts at zero
    cpu = int(spec.cpu_s or max(1, int(spec.timeout_s) + 1)) + (0 if forked else 1)
    limits = {
        resource.RLIMIT_AS: (memory, memory),
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_NOFILE: (64, 64),
        resource.RLIMIT_FSIZE: (16 * 1024 * 1024, 16 * 1024 * 1024),
        resource.RLIMIT_CORE: (0, 0),
    }
    if max_processes is not None:  # counts per uid: only meaningful with the call's own uid
        limits[resource.RLIMIT_NPROC] = (max_processes, max_processes)
    for which, value in limits.items():
        try:
            resource.prlimit(pid, which, value)
        except (ValueError, OSError) as exc:
            raise SandboxError(f"could not limit the tool process: {exc}", limit=str(which)) from exc


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _parse_result(stdout: bytes, nonce: str) -> dict[str, Any] | None:
    mark = f"{RESULT_MARK}{nonce} ".encode()
    at = stdout.rfind(mark)
    if at < 0:
        return None
    line = stdout[at + len(mark):].split(b"\n", 1)[0]
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return {"ok": False, "error": {"type": "tool_output_invalid", "message": "result line is not JSON"}}


def _parse_logs(stderr: bytes) -> list[dict[str, Any]]:
    out = []
    for raw in stderr[-MAX_LOG_BYTES:].splitlines():
        try:
            item = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            item = {"event": "tool.stderr", "line": raw.decode(errors="replace")[:500]}
        if isinstance(item, dict):
            out.append(item)
    return out


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
