"""Tools registered only in the test session (``TOOLRAIL_TOOL_MODULES``).

They let tests look at the sandbox from the inside: what a tool process sees of its
environment and of the request id, and how it behaves when killed mid-call.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tools.context import current_call, report_progress
from tools.spec import ToolSpec


class InspectArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    variable: str = Field(default="TOOLRAIL_TEST_SECRET", max_length=64)


def inspect_sandbox(args: InspectArgs) -> dict[str, Any]:
    """Report what the sandbox exposes: one env variable, the request id, the cwd, the pid."""
    call = current_call()
    return {"variable": args.variable, "value": os.environ.get(args.variable), "env_keys": sorted(os.environ),
            "request_id_env": os.environ.get("TOOLRAIL_REQUEST_ID"), "request_id_ctx": call.request_id,
            "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid()}


class SlowTransferArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_account: str
    to: str
    amount: float = Field(gt=0)
    currency: str = "CNY"
    delay_s: float = Field(default=2.0, ge=0, le=30)


def slow_transfer(args: SlowTransferArgs) -> dict[str, Any]:
    """A transfer that waits before applying, so a test can kill the worker mid-call."""
    from tools.ledger import ledger_from_env, to_cents  # noqa: PLC0415

    ledger = ledger_from_env()
    # Tell the test which process runs this call (the tool may reach only the ledger's Redis).
    # the host's pid of this process (``getpid`` is the one inside the call's PID namespace)
    ledger._redis.set(f"test:started:{current_call().call_id}", os.readlink("/proc/self"), ex=300)  # noqa: SLF001
    time.sleep(args.delay_s)
    return ledger.transfer(from_account=args.from_account, to=args.to, cents=to_cents(args.amount),
                                      currency=args.currency, idempotency_key=current_call().idempotency_key)


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(max_length=200)
    delay_s: float = Field(default=0.0, ge=0, le=10)


def slow_echo(args: EchoArgs) -> dict[str, Any]:
    """Return the value after ``delay_s``: calls of one step finish in the order their delays say."""
    time.sleep(args.delay_s)
    return {"value": args.value, "finished_at": time.time()}


class ProgressArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=3, ge=0, le=100)
    delay_s: float = Field(default=0.15, ge=0, le=2)
    flood: int = Field(default=0, ge=0, le=100_000)
    #: Flood by writing lines to the progress pipe directly (past ``report_progress``'s limit), some malformed.
    raw: bool = False


def progress_reporter(args: ProgressArgs) -> dict[str, Any]:
    """Report progress ``steps`` times, ``delay_s`` apart; then ``flood`` reports as fast as it can."""
    for i in range(1, args.steps + 1):
        time.sleep(args.delay_s)
        report_progress(i, args.steps, f"step {i} of {args.steps}")
    fd = current_call().progress_fd
    for i in range(args.flood):
        if args.raw and fd is not None:
            line = b"not json\n" if i % 100 == 0 else b'{"progress": %d, "total": %d}\n' % (i, args.flood)
            try:
                os.write(fd, line)
            except BlockingIOError:
                time.sleep(0.001)
        else:
            report_progress(i + 1, args.flood, "flooding")
    return {"steps": args.steps, "flood": args.flood}


class PollArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ticket: str = Field(max_length=64)


def poll_ticket(args: PollArgs) -> dict[str, Any]:
    """A status poll: the same call may answer differently each time (declared ``repeatable``)."""
    return {"ticket": args.ticket, "state": "pending", "at": time.time()}


def register(registry) -> None:  # noqa: ANN001 - the registry plug-in hook
    registry.add(ToolSpec.from_model("progress_reporter", ProgressArgs,
                                     entrypoint="tests.executor.tools_for_tests:progress_reporter", timeout_s=15))
    registry.add(ToolSpec.from_model("poll_ticket", PollArgs, entrypoint="tests.executor.tools_for_tests:poll_ticket",
                                     timeout_s=10, repeatable=True))
    registry.add(ToolSpec.from_model("slow_echo", EchoArgs, entrypoint="tests.executor.tools_for_tests:slow_echo",
                                     timeout_s=15))
    registry.add(ToolSpec.from_model("inspect_sandbox", InspectArgs, entrypoint="tests.executor.tools_for_tests:inspect_sandbox",
                                     timeout_s=5, memory_mb=512))
    registry.add(ToolSpec.from_model("slow_transfer", SlowTransferArgs, entrypoint="tests.executor.tools_for_tests:slow_transfer",
                                     side_effects=True, networked=True, timeout_s=8, memory_mb=512))
