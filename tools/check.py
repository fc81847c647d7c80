"""The one check path for tool calls: split → clean → validate → normalize → grounding.

Plain functions over ``ToolSpec``s, used by the decider's re-ask loop (``decider.checked``),
the job API and the OpenAI endpoint alike; nothing here asks a model or touches a queue.

``check_output`` turns one raw model output (or client-supplied calls) into an
:class:`OutputCheck`: one :class:`CallCheck` per call with canonical arguments or typed errors,
and the text answer when the output holds no call. With ``evidence`` (the conversation's
values), calls that pass validation are also checked against the tools' declared grounding
(:mod:`tools.grounding`); an unsupported value is an error with ``validator: "grounded"``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tools.cleaning import clean_text, clean_value, loads_strict, normalize_value
from tools.errors import AmbiguousOutputError, CleaningError
from tools.evidence import ConversationValues
from tools.grounding import check_grounding
from tools.spec import ToolSpec
from tools.validator import validate

__all__ = [
    "CONTRACT_VALIDATORS",
    "CallCheck",
    "MAX_CALLS_PER_OUTPUT",
    "OutputCheck",
    "call_key",
    "check_arguments",
    "check_output",
    "check_tool_calls",
    "answered_calls",
    "extract_calls",
    "flag_repeated_calls",
    "flag_repeated_side_effects",
    "prior_calls",
    "settled_calls",
]

#: Errors of a call's declared contracts (not of its form): re-asked once, then sent to review.
CONTRACT_VALIDATORS = frozenset({"grounded", "repeated_side_effect", "repeated_call"})

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
    def findings(self) -> list[dict[str, Any]]:
        """The grounding findings of every call (a subset of :meth:`all_errors`)."""
        return [e for e in self.all_errors() if e.get("validator") == "grounded"]

    @property
    def ok(self) -> bool:
        return not self.errors and all(call.ok for call in self.calls)

    def all_errors(self) -> list[dict[str, Any]]:
        out = list(self.errors)
        for call in self.calls:
            out += [{**err, "call": call.index, "tool": call.name} for err in call.errors]
        return out


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
            strict_value = loads_strict(raw)
        except AmbiguousOutputError as exc:
            return CallCheck(index, spec.name, None, raw_text, errors=exc.errors)
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
    if isinstance(value, dict) and set(value) == {"content"} and isinstance(value["content"], str):
        return [], list(notes), value["content"]  # the text-answer shape of the tool-call grammar
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
        pairs.append((name, args if name is not None or not isinstance(item, dict) else item))
        out_notes += call_notes
    return pairs, out_notes, None


def _bare_arguments(name: str | None, args: Any, item: Any, specs: Mapping[str, ToolSpec]) -> tuple[str | None, Any]:
    """A nameless object when exactly one tool is offered is that tool's arguments object."""
    if name is None and len(specs) == 1 and isinstance(item, dict) and not ({"name", "function", "arguments"} & set(item)):
        return next(iter(specs)), item
    return name, args


def _check_pairs(pairs: list[tuple[str | None, Any]], specs: Mapping[str, ToolSpec], notes: list[str],
                 evidence: ConversationValues | None = None) -> OutputCheck:
    calls: list[CallCheck] = []
    errors: list[dict[str, Any]] = []
    if len(pairs) > MAX_CALLS_PER_OUTPUT:
        errors.append({"path": "", "message": f"more than {MAX_CALLS_PER_OUTPUT} calls in one output", "validator": "maxItems"})
        pairs = pairs[:MAX_CALLS_PER_OUTPUT]
    for index, (name, args) in enumerate(pairs):
        name, args = _bare_arguments(name, args, args, specs)
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
        if call.ok and evidence is not None:
            findings = check_grounding(spec.parameters, call.arguments or {}, evidence, side_effects=spec.side_effects)
            if findings:
                call.errors, call.arguments = findings, None
        calls.append(call)
    return OutputCheck(calls=calls, errors=errors)


def check_output(raw_output: str, specs: Mapping[str, ToolSpec], *, require_call: bool = False,
                 evidence: ConversationValues | None = None) -> OutputCheck:
    """Check one raw output against the allowed tools (and their grounding, given ``evidence``)."""
    try:
        pairs, notes, content = extract_calls(raw_output)
    except CleaningError as exc:
        return OutputCheck(calls=[], errors=exc.errors or [{"path": "", "message": str(exc)}])
    check = _check_pairs(pairs, specs, notes, evidence)
    check.content = content
    if require_call and not pairs:
        check.errors.append({"path": "", "message": "a tool call is required, but the output holds none", "validator": "minItems"})
    return check


def check_tool_calls(tool_calls: list[Mapping[str, Any]], specs: Mapping[str, ToolSpec], *,
                     evidence: ConversationValues | None = None) -> OutputCheck:
    """Check calls that arrive already split (client-supplied, or parsed by the decider)."""
    pairs = []
    for item in tool_calls:
        name, args, _ = _as_call(dict(item))
        raw = item.get("raw_arguments") if isinstance(item, Mapping) else None
        pairs.append((name, raw if isinstance(raw, str) and args is None else args))
    return _check_pairs(pairs, specs, [], evidence)




def call_key(name: str, arguments: Any) -> str:
    """The identity of a call: its name and canonical arguments (key order and spacing ignored)."""
    return name + "\x00" + json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


def prior_calls(messages: list[Mapping[str, Any]]) -> dict[str, str]:
    """``{call key: tool_call_id}`` of the calls the conversation's assistant turns already made."""
    out: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or [] if message.get("role") == "assistant" else []:
            function = call.get("function") if isinstance(call.get("function"), Mapping) else call
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    continue
            if isinstance(function.get("name"), str):
                out[call_key(function["name"], arguments)] = str(call.get("id", ""))
    return out


def answered_calls(messages: list[Mapping[str, Any]]) -> dict[str, str]:
    """``{call key: tool_call_id}`` of the earlier calls whose result a ``tool`` message holds."""
    answered = {str(m.get("tool_call_id")) for m in messages if m.get("role") == "tool" and m.get("tool_call_id")}
    return {key: cid for key, cid in prior_calls(messages).items() if cid in answered}


def settled_calls(messages: list[Mapping[str, Any]]) -> dict[str, str]:
    """The answered calls (:func:`answered_calls`) made since the user's last message: what the run did on its own
    since the user last spoke. Making one of them again asks for nothing the user asked for."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return answered_calls(list(messages[last_user + 1:]))


def flag_repeated_calls(check: OutputCheck, specs: Mapping[str, ToolSpec], answered: Mapping[str, str],
                        settled: Mapping[str, str] | None = None) -> None:
    """Hold back a call identical to one whose result the conversation already holds: a read-only call's (a tool
    that may answer differently each time, e.g. a poll, declares ``repeatable``), and a side-effecting call's made
    since the user's last message (``settled``: it already ran, nobody asked for it again). The call gets a
    ``repeated_call`` error (re-asked offering the answer only); a side effect the user may have asked for again
    is :func:`flag_repeated_side_effects`'s."""
    for call in check.calls:
        spec = specs.get(call.name)
        if not call.ok or spec is None or spec.repeatable:
            continue
        earlier = ((settled or {}) if spec.side_effects else answered).get(call_key(call.name, call.arguments))
        if earlier is not None:
            done = "already ran" if spec.side_effects else "was already made"
            call.errors, call.arguments = [{"path": "", "validator": "repeated_call", "message": (
                f"this exact {call.name} call {done} ({earlier}) and its result is in the conversation; "
                "use that result to answer in text, or call something else")}], None


def flag_repeated_side_effects(check: OutputCheck, specs: Mapping[str, ToolSpec], prior: Mapping[str, str]) -> None:
    """Hold back a side-effecting call identical to one the conversation already made (exactly once
    holds within a conversation too): the call gets a ``repeated_side_effect`` error."""
    for call in check.calls:
        spec = specs.get(call.name)
        if not call.ok or spec is None or not spec.side_effects:
            continue
        earlier = prior.get(call_key(call.name, call.arguments))
        if earlier is not None:
            call.errors, call.arguments = [{"path": "", "validator": "repeated_side_effect", "message": (
                f"this exact {call.name} call was already made in this conversation ({earlier or 'an earlier turn'}); "
                "a side effect is repeated only when a person confirms it — answer in text instead")}], None
