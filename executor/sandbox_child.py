"""The sandboxed side of a tool run: ``python -m executor.sandbox_child NONCE``.

Started (often ahead of time) by ``executor.sandbox``; imports the common tool modules,
then blocks on one JSON request line on stdin. The parent sets rlimits on this process
*before* writing that line, so no tool code runs unlimited. Then: drop the network
namespace unless the tool is networked, enter the scratch dir, bind the request id for
logging, run the tool, and print one result line tagged with the nonce. The tool's own
prints go to stderr; logs are JSON lines on stderr carrying ``request_id``.
"""

from __future__ import annotations

import ctypes
import importlib
import inspect
import json
import os
import sys
import traceback

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MAX_RESULT_BYTES = 1_000_000


def drop_network() -> str:
    """Enter a fresh network namespace (no interfaces but a down loopback). Returns how."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return f"unavailable (errno {ctypes.get_errno()})"


def _emit(nonce: str, payload: dict, out) -> None:
    line = json.dumps(payload, ensure_ascii=False, default=str)
    if len(line) > MAX_RESULT_BYTES:
        line = json.dumps({"ok": False, "error": {"type": "tool_output_invalid",
                                                  "message": f"result of {len(line)} bytes exceeds {MAX_RESULT_BYTES}"}})
    out.write(f"\x00TOOLRAIL-RESULT {nonce} {line}\n")
    out.flush()


def _call(entrypoint: str, arguments: dict):
    module_name, _, func_name = entrypoint.partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
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


def die_with_parent() -> None:
    """SIGKILL this process when the worker that started it dies (no orphaned tool runs)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(0)


def main(argv: list[str]) -> int:
    nonce = argv[1] if len(argv) > 1 else ""
    die_with_parent()
    result_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the tool's prints land on stderr, never in the result channel
    sys.stdout = sys.stderr
    for module in filter(None, os.environ.get("TOOLRAIL_SANDBOX_PRELOAD", "tools.builtin").split(",")):
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
    network = "allowed" if request.get("network") else drop_network()
    os.environ.update(request.get("env", {}))
    os.chdir(request["scratch_dir"])
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                                    structlog.processors.JSONRenderer(ensure_ascii=False)],
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request["request_id"], job_id=request["job_id"],
                                           call_id=request["call_id"], tool=request["tool"])
    log = structlog.get_logger("toolrail.sandbox")
    log.info("tool.start", pid=os.getpid(), network=network)
    set_current_call(CallContext(request_id=request["request_id"], job_id=request["job_id"], call_id=request["call_id"],
                                 idempotency_key=request["idempotency_key"], scratch_dir=request["scratch_dir"]))
    try:
        result = _call(request["entrypoint"], request["arguments"])
        json.dumps(result, default=str)
        payload = {"ok": True, "result": result, "network": network}
    except MemoryError:
        payload = {"ok": False, "error": {"type": "tool_memory_limit", "message": "the tool exceeded its memory limit"}}
    except Exception as exc:  # noqa: BLE001 - every tool failure becomes a typed result
        to_dict = getattr(exc, "to_dict", None)
        error = to_dict() if callable(to_dict) else {"type": "tool_error", "message": f"{type(exc).__name__}: {exc}",
                                                     "details": {"exception": type(exc).__name__}}
        error.setdefault("details", {})["traceback"] = traceback.format_exc(limit=5)[-2000:]
        payload = {"ok": False, "error": error}
    log.info("tool.end", ok=payload["ok"])
    _emit(nonce, payload, result_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
