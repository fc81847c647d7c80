"""Validate → clean → validate, and the bounded re-ask loop. Plain functions, no broker.

``check_output`` turns one raw model output (or client-supplied calls) into checked
calls. ``decide_with_reasks`` asks a ``Decider``, checks, and on failure asks again with
the exact errors in a new message — at most ``max_reasks`` times — then gives up with
``ReasksExhausted`` carrying every attempt. Transport errors (``DeciderRetryableError``)
propagate untouched: they are Celery's to retry, never the model's fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decider.grounding import FEEDBACK_NAME
from decider.protocol import Decider, DecideRequest
from executor.cleaning import clean_text, clean_value, normalize_value
from executor.errors import CleaningError
from executor.validation import validate
from tools.spec import ToolSpec

__all__ = [
    "Attempt",
    "CallCheck",
    "OutputCheck",
    "ReasksExhausted",
    "check_arguments",
    "check_output",
    "check_tool_calls",
    "decide_with_reasks",
    "extract_calls",
    "reask_messages",
]

MAX_CALLS_PER_OUTPUT = 16
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class CallCheck:
    """One call after checking: canonical arguments when ``ok``, errors otherwise."""

    index: int
    name: str
    arguments: dict[str, Any] | None
    raw_arguments: str
    errors: list[dict[str, Any]] = field(default_factory=list)
    repairs: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors and self.arguments is not None


@dataclass
class OutputCheck:
    """A whole output after checking."""

    calls: list[CallCheck]
    errors: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors and all(call.ok for call in self.calls)

    def all_errors(self) -> list[dict[str, Any]]:
        out = list(self.errors)
        for call in self.calls:
            out += [{**err, "call": call.index, "tool": call.name} for err in call.errors]
        return out


@dataclass
class Attempt:
    """One round of the loop, as stored on the job record."""

    attempt: int
    source: str
    raw_output: str
    errors: list[dict[str, Any]]
    repairs: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "source": self.source, "raw_output": self.raw_output,
                "errors": self.errors, "repairs": self.repairs}


class ReasksExhausted(Exception):
    """Every attempt produced invalid calls; carries the attempts and the last check."""

    def __init__(self, attempts: list[Attempt], last: OutputCheck) -> None:
        super().__init__(f"tool calls still invalid after {len(attempts)} attempt(s)")
        self.attempts = attempts
        self.last = last


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _dump(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def check_arguments(spec: ToolSpec, raw: str | Mapping[str, Any], *, index: int = 0) -> CallCheck:
    """Normalize and validate one call's arguments; clean and re-validate on failure."""
    raw_text = _dump(raw)
    schema = spec.parameters
    strict_value: Any = None
    if isinstance(raw, Mapping):
        strict_value = dict(raw)
    else:
        try:
            strict_value = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError):  # JSONDecodeError, NaN/Infinity, integers past the digit limit
            strict_value = None
    if isinstance(strict_value, dict):
        value, notes = normalize_value(strict_value, schema)
        if not (errors := validate(value, schema)):
            return CallCheck(index, spec.name, value, raw_text, repairs=notes)
    try:
        parsed, text_notes = (strict_value, ()) if strict_value is not None else clean_text(raw_text)
    except CleaningError as exc:
        return CallCheck(index, spec.name, None, raw_text, errors=exc.errors or [{"path": "", "message": str(exc)}])
    if not isinstance(parsed, dict):
        return CallCheck(index, spec.name, None, raw_text,
                         errors=[{"path": "", "message": f"arguments must be a JSON object, got {type(parsed).__name__}",
                                  "validator": "type"}])
    value, value_notes = clean_value(parsed, schema)
    errors = validate(value, schema)
    return CallCheck(index, spec.name, None if errors else value, raw_text, errors=errors,
                     repairs=(*text_notes, *value_notes))


def _as_call(item: Any) -> tuple[str | None, Any, list[str]]:
    """(name, raw arguments, notes) of one call-like object."""
    if not isinstance(item, dict):
        return None, None, []
    notes: list[str] = []
    if "function" in item and isinstance(item["function"], dict):
        item = item["function"]
    name = item.get("name")
    if "arguments" in item:
        args = item["arguments"]
    elif "parameters" in item:
        args, notes = item["parameters"], ["read 'parameters' as 'arguments'"]
    elif "args" in item:
        args, notes = item["args"], ["read 'args' as 'arguments'"]
    else:
        args = {}
    return name if isinstance(name, str) else None, args, notes


def extract_calls(raw_output: str) -> tuple[list[tuple[str | None, Any]], list[str], str | None]:
    """Split a raw output into ``(name, raw arguments)`` pairs.

    Accepts a JSON array of calls, a single call object, ``{"tool_calls": [...]}`` in the
    OpenAI shape, and ``<tool_call>…</tool_call>`` blocks — each possibly broken JSON.
    Returns the pairs, repair notes, and plain-text content when the output holds no call.
    """
    tagged = _TAGGED.findall(raw_output)
    if tagged:
        pairs, notes = [], ["read <tool_call> blocks"]
        for block in tagged:
            value, block_notes = clean_text(block)
            name, args, call_notes = _as_call(value)
            pairs.append((name, args))
            notes += [*block_notes, *call_notes]
        return pairs, notes, None
    stripped = raw_output.strip()
    if not stripped or not re.search(r"[\[{［｛]", stripped):
        return [], [], stripped or None
    value, notes = clean_text(stripped)
    items: list[Any]
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        items = value["tool_calls"]
    elif isinstance(value, list):
        items = value
    else:
        items = [value]
    pairs = []
    out_notes = list(notes)
    for item in items[: MAX_CALLS_PER_OUTPUT + 1]:
        name, args, call_notes = _as_call(item)
        pairs.append((name, args))
        out_notes += call_notes
    return pairs, out_notes, None


def _check_pairs(pairs: list[tuple[str | None, Any]], specs: Mapping[str, ToolSpec], notes: list[str]) -> OutputCheck:
    calls: list[CallCheck] = []
    errors: list[dict[str, Any]] = []
    if len(pairs) > MAX_CALLS_PER_OUTPUT:
        errors.append({"path": "", "message": f"more than {MAX_CALLS_PER_OUTPUT} calls in one output", "validator": "maxItems"})
        pairs = pairs[:MAX_CALLS_PER_OUTPUT]
    for index, (name, args) in enumerate(pairs):
        if name is None:
            calls.append(CallCheck(index, "", None, _dump(args), errors=[{"path": "/name", "message": "call has no tool name",
                                                                          "validator": "required"}]))
            continue
        spec = specs.get(name)
        if spec is None:
            calls.append(CallCheck(index, name, None, _dump(args), errors=[{
                "path": "/name", "message": f"unknown tool {name!r}; allowed: {sorted(specs)}", "validator": "enum"}]))
            continue
        if isinstance(args, str) and not args.strip():
            args = "{}"
        call = check_arguments(spec, args if isinstance(args, (str, dict)) else _dump(args), index=index)
        if notes and index == 0:
            call.repairs = (*notes, *call.repairs)
        calls.append(call)
    return OutputCheck(calls=calls, errors=errors)


def check_output(raw_output: str, specs: Mapping[str, ToolSpec], *, require_call: bool = False) -> OutputCheck:
    """Check one raw output against the allowed tools."""
    try:
        pairs, notes, content = extract_calls(raw_output)
    except CleaningError as exc:
        return OutputCheck(calls=[], errors=exc.errors or [{"path": "", "message": str(exc)}])
    check = _check_pairs(pairs, specs, notes)
    check.content = content
    if require_call and not pairs:
        check.errors.append({"path": "", "message": "a tool call is required, but the output holds none", "validator": "minItems"})
    return check


def check_tool_calls(tool_calls: list[Mapping[str, Any]], specs: Mapping[str, ToolSpec]) -> OutputCheck:
    """Check calls that arrive already split (client-supplied, or parsed by the decider)."""
    pairs = []
    for item in tool_calls:
        name, args, _ = _as_call(dict(item))
        raw = item.get("raw_arguments") if isinstance(item, Mapping) else None
        pairs.append((name, raw if isinstance(raw, str) and args is None else args))
    return _check_pairs(pairs, specs, [])


def reask_messages(messages: list[dict[str, Any]], raw_output: str, errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A *new* message list: the conversation, the bad output, and the exact errors."""
    lines = []
    for err in errors[:8]:
        where = f"call {err['call']} ({err.get('tool') or '?'}) " if "call" in err else ""
        lines.append(f"- {where}{err.get('path') or '/'}: {err.get('message')}")
    feedback = ("Your previous tool call was invalid:\n" + "\n".join(lines) +
                "\nReply again with corrected tool calls only. Use only values the user gave; if a required value is "
                "missing or not allowed, do not call the tool.")
    return [*messages, {"role": "assistant", "content": raw_output},
            {"role": "user", "name": FEEDBACK_NAME, "content": feedback}]


def _decision_output(decision: Any) -> tuple[str, list[dict[str, Any]] | None]:
    calls = [c.model_dump() if hasattr(c, "model_dump") else dict(c) for c in (decision.tool_calls or [])]
    return decision.raw_output, calls or None


def decide_with_reasks(decider: Decider, request: DecideRequest, *, max_reasks: int,
                       first: tuple[str, str, OutputCheck] | None = None) -> tuple[OutputCheck, list[Attempt]]:
    """Ask, check, re-ask with the errors; at most ``max_reasks`` re-asks.

    ``first`` is an already-checked first attempt (client-supplied output): (source,
    raw_output, check). Raises ``ReasksExhausted`` when attempts run out.
    """
    specs = {spec.name: spec for spec in request.tools}
    require = request.tool_choice == "required" or isinstance(request.tool_choice, dict)
    attempts: list[Attempt] = []
    messages = list(request.messages)
    check: OutputCheck | None = None
    raw = ""
    if first is not None:
        source, raw, check = first
        attempts.append(Attempt(0, source, raw, check.all_errors(), [r for c in check.calls for r in c.repairs]))
    while check is None or not check.ok:
        if check is not None:
            if len(attempts) > max_reasks:
                raise ReasksExhausted(attempts, check)
            messages = reask_messages(messages, raw, check.all_errors())
        attempt_no = len(attempts)
        decision = decider.decide(request.model_copy(update={"messages": messages, "attempt": attempt_no}))
        raw, calls = _decision_output(decision)
        if calls is not None:
            check = check_tool_calls(calls, specs)
        elif decision.content is not None and not re.search(r"[\[{]", raw or ""):
            check = OutputCheck(calls=[], content=decision.content)
        else:
            check = check_output(raw, specs)
        if require and not check.calls and not check.errors:
            check.errors.append({"path": "", "message": "a tool call is required, but the output holds none",
                                 "validator": "minItems"})
        attempts.append(Attempt(attempt_no, "decider", raw, check.all_errors(), [r for c in check.calls for r in c.repairs]))
    return check, attempts
