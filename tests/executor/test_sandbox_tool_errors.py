"""A tool's own errors and output, as the sandbox records them: the type rule, tracebacks on request, fair logs.

The end-to-end cases (a real job through a real worker, a tool package outside the tree) are in
``test_sandbox_own_tools.py``; here the rules themselves, and the operator's switch, against a
real ``ProcessSandbox`` and a tool module written to a temporary folder.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from executor.errors import SandboxError
from executor.sandbox.boundary import CallRun
from executor.sandbox.answer import (
    RESERVED_TYPES,
    SANDBOX_REPORTED_TYPES,
    TOOL_RAISABLE_TYPES,
    checked_answer,
    tool_error_type,
)
from executor.sandbox.pipes import MAX_OUTPUT_LINES, Captured, log_output, output_budgets
from executor.sandbox.process import ProcessSandbox
from tools.spec import ToolSpec

RUDE_TOOLS = '''
from pydantic import BaseModel, ConfigDict

from tools.errors import ToolError


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = ""


class OrderNotFound(ToolError):
    type = "order_not_found"


def helper(order_id):
    raise OrderNotFound(f"no order {order_id}", order_id=order_id)


def find(args: Args) -> dict:
    return helper(args.order_id)
'''


# ----------------------------------------------------------------- the type rule


@pytest.mark.parametrize("claimed", ["order_not_found", "payment_declined", "x", "a" * 64, "insufficient_funds",
                                     "tool_input_error", "tool_error"])
def test_a_tools_own_snake_case_type_is_kept(claimed: str) -> None:
    assert tool_error_type(claimed) == claimed


@pytest.mark.parametrize("claimed", ["OrderNotFound", "order-not-found", "1st_error", "", "a" * 65, " order",
                                     "order\nnot_found", None, 7, "tool_timeout", "tool_crashed", "tool_left_process",
                                     "sandbox_denied", "sandbox_error", "mcp_tool_error", "timeout", "circuit_open",
                                     "unknown_tool", "invalid_output", "toolrail_internal"])
def test_a_malformed_or_platform_type_is_refused(claimed: object) -> None:
    assert tool_error_type(claimed) is None


def test_the_sandbox_reports_its_own_classifications_but_a_tool_does_not() -> None:
    for kind in SANDBOX_REPORTED_TYPES:
        assert tool_error_type(kind) is None and tool_error_type(kind, from_sandbox=True) == kind
    assert tool_error_type("tool_left_process", from_sandbox=True) is None  # only the call parent counts leftovers


def _platform_types() -> set[str]:
    """Every ``type`` an error class of the platform declares (the executor, tools, the sandbox, MCP, limits)."""
    names: set[str] = set()
    for module_name in ("executor.errors", "tools.errors", "tools.registry", "executor.sandbox.process",
                        "executor.calls.breaker", "executor.calls.concurrency", "executor.api.ratelimit",
                        "mcpbridge.errors"):
        module = importlib.import_module(module_name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Exception) and isinstance(getattr(value, "type", None), str):
                names.add(value.type)
    return names


def test_no_platform_error_type_can_be_claimed_by_a_tool_except_those_meant_for_tools() -> None:
    types = _platform_types()
    assert {"tool_timeout", "circuit_open", "sandbox_denied", "mcp_unavailable", "not_found"} <= types
    claimable = {kind for kind in types if tool_error_type(kind) is not None}
    assert claimable <= TOOL_RAISABLE_TYPES, claimable
    assert not (RESERVED_TYPES & TOOL_RAISABLE_TYPES)


def test_the_call_parent_keeps_a_tools_error_and_names_a_refused_type() -> None:
    own = checked_answer({"ok": False, "error": {"type": "order_not_found", "message": "no order", "details": {"id": 1}}})
    assert own == {"ok": False, "error": {"type": "order_not_found", "message": "no order", "details": {"id": 1}}}
    forged = checked_answer({"ok": False, "error": {"type": "tool_timeout", "message": "m", "details": {"a": 1}}})
    assert forged["error"] == {"type": "tool_error", "message": "m", "details": {"a": 1, "refused_type": "tool_timeout"}}
    long = checked_answer({"ok": False, "error": {"type": "x" * 500, "message": "m" * 5000}})["error"]
    assert long["type"] == "tool_error" and len(long["details"]["refused_type"]) == 80 and len(long["message"]) == 2000


# ----------------------------------------------------------------- tracebacks, asked for by the operator


@pytest.fixture(scope="module")
def rude_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolSpec]:
    folder = tmp_path_factory.mktemp("rude")
    (folder / "rude_tools.py").write_text(RUDE_TOOLS)
    sys.path.insert(0, str(folder))
    module = importlib.import_module("rude_tools")
    yield ToolSpec.from_model("rude_find", module.Args, entrypoint="rude_tools:find", timeout_s=5)
    sys.path.remove(str(folder))
    sys.modules.pop("rude_tools", None)


def _failure(box: ProcessSandbox, spec: ToolSpec) -> SandboxError:
    with pytest.raises(SandboxError) as caught:
        box.run(spec, CallRun(request_id="r", job_id="j", call_id="c", idempotency_key="k", arguments={"order_id": "Z-9"}))
    return caught.value


def test_no_traceback_unless_asked_and_the_operator_can_ask_for_every_tool(rude_tools: ToolSpec,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from toolrail.settings import get_settings

    box = ProcessSandbox(preload="tools.builtin,rude_tools", error_tracebacks=False)
    try:
        quiet = _failure(box, rude_tools)
    finally:
        box.close()
    assert quiet.to_dict() == {"type": "order_not_found", "message": "no order Z-9", "details": {"order_id": "Z-9"}}
    monkeypatch.setenv("TOOLRAIL_TOOL_ERROR_TRACEBACKS", "1")
    get_settings.cache_clear()
    try:
        box = ProcessSandbox(preload="tools.builtin,rude_tools")  # the setting, read where the sandbox is built
        try:
            traced = _failure(box, rude_tools)
        finally:
            box.close()
    finally:
        monkeypatch.delenv("TOOLRAIL_TOOL_ERROR_TRACEBACKS")
        get_settings.cache_clear()
    trace = traced.details["traceback"]
    assert 'File "rude_tools.py"' in trace and "in helper" in trace and "executor" not in trace, trace
    assert 'File "/' not in trace and trace.rstrip().endswith("rude_tools.OrderNotFound: no order Z-9"), trace


# ----------------------------------------------------------------- output: each stream its own budget


@pytest.mark.parametrize(("counts", "budgets"), [
    ({"stdout": 5000, "stderr": 5000}, {"stdout": 100, "stderr": 100}),
    ({"stdout": 5000, "stderr": 10}, {"stdout": 190, "stderr": 10}),
    ({"stdout": 0, "stderr": 5000}, {"stdout": 0, "stderr": 200}),
    ({"stdout": 30, "stderr": 40}, {"stdout": 30, "stderr": 40}),
])
def test_each_stream_gets_half_and_what_one_leaves_goes_to_the_other(counts: dict, budgets: dict) -> None:
    assert output_budgets(counts) == budgets
    assert sum(budgets.values()) <= MAX_OUTPUT_LINES


def test_a_stdout_flood_does_not_hide_stderr_and_the_drops_are_counted_per_stream() -> None:
    streams = {name: Captured(10_000_000) for name in ("stdout", "stderr", "result")}
    streams["stdout"].add(b"".join(b"out %d\n" % i for i in range(5000)))
    streams["stderr"].add(b"".join(b"err %d\n" % i for i in range(5000)))
    spec = ToolSpec(name="noisy", parameters={"type": "object", "properties": {}})
    with capture_logs() as events:
        log_output(streams, spec=spec, call=CallRun(request_id="r", job_id="j", call_id="c", idempotency_key="k",
                                                     arguments={}))
    lines = [e for e in events if e["event"] == "tool.output"]
    assert [sum(e["stream"] == s for e in lines) for s in ("stdout", "stderr")] == [100, 100]
    assert [e["line"] for e in lines if e["stream"] == "stderr"][:1] == ["err 0"]
    dropped = {e["stream"]: (e["lines_logged"], e["lines_not_logged"]) for e in events
               if e["event"] == "tool.output_truncated"}
    assert dropped == {"stdout": (100, 4900), "stderr": (100, 4900)}


def test_nothing_dropped_means_no_truncation_event() -> None:
    streams = {"stdout": Captured(1000), "stderr": Captured(1000)}
    streams["stdout"].add(b"one\ntwo\n")
    spec = ToolSpec(name="calm", parameters={"type": "object", "properties": {}})
    with capture_logs() as events:
        log_output(streams, spec=spec, call=CallRun(request_id="r", job_id="j", call_id="c", idempotency_key="k",
                                                     arguments={}))
    assert [e["event"] for e in events] == ["tool.output", "tool.output"]


def test_the_module_path_of_a_traceback_is_relative(rude_tools: ToolSpec) -> None:
    from executor.sandbox.child import tool_traceback

    module = sys.modules["rude_tools"]
    try:
        module.find(module.Args(order_id="Q"))
    except Exception as exc:  # noqa: BLE001
        trace = tool_traceback(exc, "rude_tools")
    assert trace.startswith("Traceback (the tool's own frames):\n  File \"rude_tools.py\"")
    assert str(Path(module.__file__).parent) not in trace and "test_sandbox_tool_errors" not in trace


# ----------------------------------------------------------------- whose MemoryError, whose PermissionError

OWN_ERRORS_TOOLS = '''
from pydantic import BaseModel, ConfigDict


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    what: str


def act(args: Args) -> dict:
    if args.what == "own_memory":
        raise MemoryError("the order cache is full")
    if args.what == "own_permission":
        raise PermissionError("refunds need a manager's approval")
    if args.what == "allocate":
        return {"size": len(bytearray(4 * 1024 * 1024 * 1024))}
    if args.what == "write_outside":
        with open("/usr/toolrail-not-yours", "w") as fh:
            fh.write("x")
    return {}
'''


@pytest.fixture(scope="module")
def own_errors_tool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolSpec]:
    folder = tmp_path_factory.mktemp("own_errors")
    (folder / "own_errors_tools.py").write_text(OWN_ERRORS_TOOLS)
    sys.path.insert(0, str(folder))
    module = importlib.import_module("own_errors_tools")
    yield ToolSpec.from_model("own_errors_act", module.Args, entrypoint="own_errors_tools:act", timeout_s=10,
                              memory_mb=256)
    sys.path.remove(str(folder))
    sys.modules.pop("own_errors_tools", None)


@pytest.mark.parametrize(("what", "expected", "exception"), [
    ("own_memory", "tool_error", "MemoryError"),  # was tool_memory_limit: the platform's, for the tool's own raise
    ("own_permission", "tool_error", "PermissionError"),  # was sandbox_denied
    ("allocate", "tool_memory_limit", None),  # 4 GiB under a 256 MB limit: the sandbox's
    ("write_outside", "sandbox_denied", "PermissionError"),  # a write the sandbox refuses
])
def test_a_tools_own_memory_or_permission_error_is_the_tools(own_errors_tool: ToolSpec, what: str, expected: str,
                                                             exception: str | None) -> None:
    box = ProcessSandbox(preload="tools.builtin,own_errors_tools", error_tracebacks=False)
    try:
        with pytest.raises(SandboxError) as caught:
            box.run(own_errors_tool, CallRun(request_id="r", job_id="j", call_id="c", idempotency_key="k",
                                             arguments={"what": what}))
    finally:
        box.close()
    error = caught.value.to_dict()
    assert error["type"] == expected, error
    if exception is not None:
        assert error["details"].get("exception") == exception, error
