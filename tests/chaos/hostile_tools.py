"""Tools that misbehave on purpose: sandbox escape attempts and a fast transfer for chaos runs.

Registered through ``TOOLRAIL_TOOL_MODULES=tests.chaos.hostile_tools`` (workers) or used
directly as specs (``ESCAPE_SPEC``, ``CHAOS_TRANSFER_SPEC``) against a ``ProcessSandbox``.
An escape tool *returns* what it managed to get; a test that sees a result instead of a
typed error has found a hole.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tools.context import current_call
from tools.spec import ToolSpec

__all__ = ["CHAOS_TRANSFER_SPEC", "ESCAPE_SPEC", "LINGER_SPEC", "chaos_transfer", "escape", "linger", "register"]

# Modes that probe the result channel and the output caps: ``forge_result`` writes result frames of its own
# everywhere it can, ``non_object`` / ``deep_result`` / ``huge_result`` / ``recursion`` return what no result
# may be, ``flood_stdout`` prints ``amount`` MB, ``list_scratch_root`` / ``keep_secret`` probe other calls' files.


class EscapeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["env_secret", "read_file", "write_file", "fork_bomb", "memory", "cpu", "network",
                  "leave_child", "leave_daemon", "signal_parent", "ok", "unix_socket", "forge_result", "non_object",
                  "deep_result", "huge_result", "recursion", "flood_stdout", "print_lines", "list_scratch_root",
                  "keep_secret", "sys_path", "ipc_put", "ipc_get", "sleep"]
    target: str = Field(default="", max_length=500)
    amount: int = Field(default=0, ge=0, le=1_000_000_000)


IPC_KEY = 0x7A11  # the System V key a call leaves a message under, for a later call to find
_IPC_CREAT = 0o1000


def _shm(size: int, flags: int) -> tuple[Any, int]:
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    shm_id = libc.shmget(IPC_KEY, size, flags)
    if shm_id < 0:
        raise PermissionError(ctypes.get_errno(), f"shmget: {os.strerror(ctypes.get_errno())}")
    return libc, shm_id


def _ipc(mode: str, target: str) -> dict[str, Any]:
    """System V shared memory with mode 0666: a channel to later calls (another tenant's) unless IPC is per call."""
    import ctypes  # noqa: PLC0415

    libc, shm_id = _shm(4096, (_IPC_CREAT | 0o666) if mode == "ipc_put" else 0)
    address = libc.shmat(shm_id, None, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise PermissionError(ctypes.get_errno(), "shmat refused")
    if mode == "ipc_put":
        data = (target or "left by an earlier call").encode()[:4000]
        ctypes.memmove(address, data + b"\0", len(data) + 1)
        return {"left": True}
    return {"leaked": ctypes.string_at(address).decode(errors="replace")}


def _parent_pid() -> int:
    """The parent's pid as the host sees it: ``getppid()`` is 0 when the parent is outside our PID namespace."""
    with open("/proc/self/status") as fh:
        return next((int(line.split()[1]) for line in fh if line.startswith("PPid:")), 0) or os.getppid()


def escape(args: EscapeArgs) -> dict[str, Any]:
    """Try one escape; return what leaked (a hole) or raise (the sandbox held)."""
    mode, target = args.mode, args.target
    if mode == "env_secret":
        name = target or "TOOLRAIL_TEST_SECRET"
        if name in os.environ:
            return {"leaked": os.environ[name]}
        with open(f"/proc/{_parent_pid()}/environ", "rb") as fh:  # the worker's environment, via /proc
            data = fh.read()
        return {"leaked": name.encode() in data, "bytes": len(data)}
    if mode == "read_file":
        with open(target, "rb") as fh:
            return {"leaked": fh.read(200).decode(errors="replace")}
    if mode == "write_file":
        with open(target, "w") as fh:
            fh.write("escaped")
        return {"wrote": target}
    if mode == "fork_bomb":
        children = []
        while True:
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            children.append(pid)
            if len(children) > 10_000:
                return {"forked": len(children)}
    if mode == "memory":
        blobs = []
        for _ in range(4096):
            blobs.append(bytearray(64 * 1024 * 1024))
            blobs[-1][::4096] = b"x" * len(blobs[-1][::4096])
        return {"allocated_mb": 64 * len(blobs)}
    if mode == "cpu":
        deadline = time.monotonic() + 120
        n = 0
        while time.monotonic() < deadline:
            n += 1
        return {"spun": n}
    if mode == "network":
        host, _, port = (target or "1.1.1.1:53").rpartition(":")
        with socket.create_connection((host, int(port)), timeout=2):
            return {"connected": target}
    if mode == "leave_child":
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return {"child": proc.pid}
    if mode == "leave_daemon":
        if os.fork() == 0:  # double fork + setsid: the classic daemon, out of the process group
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        os.wait()
        return {"daemonized": True}
    if mode == "sleep":  # past the call's wall-clock limit: the sandbox must end it
        time.sleep(args.amount)
        return {"slept": args.amount}
    if mode in ("ipc_put", "ipc_get"):
        return _ipc(mode, target)
    if mode == "signal_parent":
        parent = _parent_pid()
        os.kill(parent, 9)
        return {"killed_parent": parent}
    if mode == "unix_socket":  # a local service on a Unix socket (PostgreSQL, MariaDB, the Redis socket)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(target)
            return {"connected": target}
    if mode == "forge_result":
        return _forge(target)
    if mode == "non_object":
        return [1, 2, 3]  # type: ignore[return-value]
    if mode == "deep_result":
        value: Any = {}
        for _ in range(args.amount or 100_000):
            value = {"d": value}
        return value
    if mode == "huge_result":
        return {"blob": "x" * (args.amount or 50_000_000)}
    if mode == "recursion":
        def down(n: int) -> int:
            return down(n + 1) + 1
        return {"depth": down(0)}
    if mode == "flood_stdout":  # ``amount`` megabytes on stdout, then a normal result
        chunk = ("y" * 1023 + "\n") * 1024
        for _ in range(args.amount):
            sys.stdout.write(chunk)
        sys.stdout.flush()
        return {"printed_mb": args.amount}
    if mode == "print_lines":
        for i in range(args.amount):
            print(f"{target} line {i}")
            print(f"{target} err {i}", file=sys.stderr)
        return {"printed": args.amount}
    if mode == "list_scratch_root":  # what of other calls' scratch dirs can this call see or read?
        root = os.path.dirname(os.getcwd()) if target == "" else target
        seen = {"cwd": os.getcwd(), "parent_listing": _try(lambda: sorted(os.listdir(os.path.dirname(os.getcwd()))))}
        seen["target"] = _try(lambda: open(target).read()) if target else None  # noqa: SIM115
        seen["root"] = root
        return seen
    if mode == "sys_path":
        return {"sys_path": list(sys.path), "cwd": os.getcwd()}
    if mode == "keep_secret":  # write a secret into this call's scratch dir and stay a while
        with open("secret.txt", "w") as fh:
            fh.write(target)
        time.sleep(args.amount or 3)
        return {"cwd": os.getcwd()}
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = None
    return {"ok": True, "pid": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd(), "pid_ns": pid_ns}


def _try(action: Any) -> Any:
    try:
        return action()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"


def _forge(text: str) -> dict[str, Any]:
    """Every way a tool might write a result frame of its own; returns what it managed."""
    forged = text or '{"ok": true, "result": {"forged": true}}'
    tried: dict[str, Any] = {}
    for fd in range(3, 64):  # a result pipe inherited by mistake
        try:
            os.write(fd, forged.encode())
            tried[f"fd{fd}"] = "written"
        except OSError as exc:
            tried[f"fd{fd}"] = exc.errno
    for path in (f"/proc/{os.getppid()}/fd/3", "/proc/1/fd/3"):  # the monitor's result pipe via /proc
        try:
            with open(path, "w") as fh:
                fh.write(forged)
            tried[path] = "written"
        except OSError as exc:
            tried[path] = exc.errno
    print("\x00TOOLRAIL-RESULT 0000 " + forged)  # the old line-on-stdout channel
    os.write(1, b"\x00TOOLRAIL-RESULT " + forged.encode() + b"\n")
    return {"forged": False, "tried": {k: v for k, v in tried.items() if v == "written"}}


class ChaosTransferArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_account: str = Field(min_length=1, max_length=64)
    to: str = Field(min_length=1, max_length=64)
    amount: float = Field(gt=0, le=1_000_000)
    currency: Literal["CNY", "USD", "EUR"] = "CNY"
    delay_s: float = Field(default=0.2, ge=0, le=2)


def chaos_transfer(args: ChaosTransferArgs) -> dict[str, Any]:
    """A transfer that takes a little while, so kills land mid-call; applied once per key."""
    from tools.ledger import ledger_from_env, to_cents  # noqa: PLC0415

    time.sleep(args.delay_s)
    return ledger_from_env().transfer(from_account=args.from_account, to=args.to, cents=to_cents(args.amount),
                                      currency=args.currency, idempotency_key=current_call().idempotency_key)


class LingerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(ge=0, le=7)
    tag: str = Field(min_length=1, max_length=64)


def linger(args: LingerArgs) -> dict[str, Any]:
    """A long call without side-effect protection: counts its own executions, so a redelivery shows."""
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(os.environ["TOOLRAIL_LEDGER_URL"], socket_timeout=5)
    runs = client.incr(f"chaos:linger:{args.tag}")
    time.sleep(args.seconds)
    return {"runs_seen_at_start": runs}


ESCAPE_SPEC = ToolSpec.from_model("escape", EscapeArgs, entrypoint="tests.chaos.hostile_tools:escape", timeout_s=8,
                                  memory_mb=256, cpu_s=2)
CHAOS_TRANSFER_SPEC = ToolSpec.from_model("chaos_transfer", ChaosTransferArgs,
                                          entrypoint="tests.chaos.hostile_tools:chaos_transfer", side_effects=True,
                                          networked=True, timeout_s=3, memory_mb=512)


LINGER_SPEC = ToolSpec.from_model("linger", LingerArgs, entrypoint="tests.chaos.hostile_tools:linger", networked=True,
                                  timeout_s=6.5, memory_mb=512)


def register(registry) -> None:  # noqa: ANN001 - the registry plug-in hook
    registry.add(ESCAPE_SPEC)
    registry.add(CHAOS_TRANSFER_SPEC)
    registry.add(LINGER_SPEC)
