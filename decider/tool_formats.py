"""Tool-call formats as data: how each model family writes calls, and how toolrail forces and reads them.

A :class:`ToolFormat` says, for one family,

- how the conversation goes to the model's own chat template (:meth:`ToolFormat.template_messages`:
  earlier calls and their results as the template renders them — ``<tool_response>``, ``ipython``,
  ``[TOOL_RESULTS]``), the tools themselves going through ``apply_chat_template(..., tools=...)``;
- the constraint that forces its call syntax while leaving text free (:meth:`ToolFormat.structural_tag`,
  an xgrammar structural tag: a trigger, then each tool's own JSON Schema, then the end marker);
- how its output is read (:meth:`ToolFormat.scan`, run by the per-request :class:`NativeCallParser`).

Formats are registered by name (:data:`TOOL_FORMATS`) behind one small base class, as vLLM keeps its
tool parsers; a format object holds no per-request state (a parser does, one per request). The
format of a model comes from its chat template (:func:`detect_tool_format`) unless its manifest
(``toolrail-model.json``, key ``tool_call_format``) names one. ``json_array`` is the platform's own
``[{"name", "arguments"}]`` shape (SmolLM2's template has no tools): it keeps the older path in
:mod:`decider.parser` / :func:`decider.schema.tool_calls_schema` and has no structural tag.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from decider.errors import InvalidRequestError
from decider.parser import OnCall, ParsedOutput, ToolCallDelta, parse_output
from decider.prompt import template_messages
from tools.calls import ToolCall, call_id

__all__ = [
    "DEFAULT_TOOL_FORMAT",
    "HermesFormat",
    "JsonArrayFormat",
    "Llama3JsonFormat",
    "MANIFEST_KEY",
    "MistralFormat",
    "NativeCallParser",
    "Scan",
    "ScannedCall",
    "TOOL_FORMATS",
    "ToolFormat",
    "detect_tool_format",
    "get_tool_format",
    "read_native_calls",
    "resolve_tool_format",
]

#: The fallback: the platform's JSON array of calls, for templates that know no tools.
DEFAULT_TOOL_FORMAT = "json_array"
#: Key of the model manifest (``toolrail-model.json`` in the model directory) that overrides detection.
MANIFEST_KEY = "tool_call_format"
MANIFEST_FILENAME = "toolrail-model.json"
#: Whitespace characters in a row a native call's JSON may hold.
JSON_MAX_WHITESPACE = 1


@dataclass(frozen=True)
class ScannedCall:
    """One call found in a decoded text."""

    name: str
    #: The arguments' JSON text as written (None when the call carries none).
    raw_arguments: str | None
    #: Offset just past the call's end marker; None while it is still open.
    end: int | None


@dataclass
class Scan:
    """A whole decoded text read in one family's syntax."""

    calls: list[ScannedCall] = field(default_factory=list)
    #: The text outside the calls, stripped (None when there is none).
    content: str | None = None
    #: Why the text is not a complete decision (a call left open, a body that is not JSON).
    problem: str | None = None


class ToolFormat:
    """One family's tool-call syntax. Subclasses set the class attributes and implement :meth:`scan`."""

    name: ClassVar[str]
    #: Whether the family's template renders tools itself (``apply_chat_template(tools=...)``).
    native: ClassVar[bool] = True
    #: The family writes all its calls in one block (stop after it).
    one_block: ClassVar[bool] = False
    #: What stands between two calls the family writes in a row.
    separator: ClassVar[str] = "\n"

    def detect(self, template: str) -> bool:
        """Whether a chat template writes calls in this format."""
        raise NotImplementedError

    def tags(self, tools: Sequence[tuple[str, Mapping[str, Any]]], *, max_calls: int | None,
             calls_schema: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
        """The triggers and tags of the structural tag (one tag per tool, or one for the whole call list)."""
        raise NotImplementedError

    def structural_tag(self, tools: Sequence[tuple[str, Mapping[str, Any]]], *, allow_text: bool,
                       max_calls: int | None, calls_schema: Mapping[str, Any]) -> dict[str, Any]:
        """The xgrammar structural tag forcing this syntax: text free (when ``allow_text``) until a trigger,
        then a call whose arguments follow that tool's grammar schema. ``tools`` are ``(name, grammar
        parameters)`` pairs (already narrowed and bounded); ``calls_schema`` is the JSON-array schema of the
        same calls (formats that write a list in one block use it)."""
        triggers, tags = self.tags(tools, max_calls=max_calls, calls_schema=calls_schema)
        return {"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": triggers, "tags": tags, "at_least_one": not allow_text,
            "stop_after_first": self.one_block or max_calls == 1}}

    def ebnf(self, tools: Sequence[tuple[str, Mapping[str, Any]]], *, allow_text: bool, max_calls: int | None,
             calls_schema: Mapping[str, Any]) -> str:
        """The same constraint as :meth:`structural_tag`, as plain EBNF for a server's guided decoding: text free
        until a trigger through one ``TagDispatch`` root rule (``allow_text``), else the calls alone, one after
        another. Written in the syntax the xgrammar of TensorRT-LLM 1.0 (0.1.21) parses too, which takes a
        ``TagDispatch`` only as the root rule and no ``{n, -1}``: what the newer xgrammar prints from the tag
        itself is refused there."""
        from decider.grammar import schema_rules  # lazy: grammar loads xgrammar (torch); engine_build reads the formats without it

        triggers, tags = self.tags(tools, max_calls=max_calls, calls_schema=calls_schema)
        rules, whole, rest = [], [], {trigger: [] for trigger in triggers}
        for index, tag in enumerate(tags):
            text, root = schema_rules(json.dumps(tag["content"]["json_schema"]), f"t{index}_")
            rules.append(text)
            begin, end = tag["begin"], _literal(tag["end"])
            whole.append(f"{_literal(begin)} {root} {end}")
            trigger = next(t for t in triggers if begin.startswith(t))
            rest[trigger].append(f"{_literal(begin[len(trigger):])} {root} {end}")
        single = self.one_block or max_calls == 1
        if allow_text:
            groups = [f"call_after_{i} ::= {' | '.join(f'({alt})' for alt in alts)}" for i, alts in enumerate(rest.values())]
            dispatch = ", ".join(f"({_literal(trigger)}, call_after_{i})" for i, trigger in enumerate(rest))
            head = [f"root ::= TagDispatch({dispatch}, "
                    f"loop_after_dispatch={'false' if single else 'true'})", *groups]
        else:
            more = "" if single else f" ({_literal(self.separator)} call){{0,{max(0, (max_calls or 64) - 1)}}}"
            head = [f"root ::= call{more}", f"call ::= {' | '.join(f'({alt})' for alt in whole)}"]
        return "\n".join([*head, *rules]) + "\n"

    def template_messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Copies of ``messages`` as this family's template takes them: calls with their arguments as
        objects (the templates ``tojson`` them), results in the ``tool`` role for the template to render."""
        out = template_messages(messages, template_tools=True)
        for message in out:
            calls = message.get("tool_calls")
            if calls:
                message["tool_calls"] = [_call_with_object_arguments(call) for call in calls]
        return out

    def scan(self, text: str) -> Scan:
        """Read a whole decoded text as calls and text."""
        raise NotImplementedError

    def parser(self, request_id: str, *, attempt: int = 0, on_call: OnCall | None = None) -> NativeCallParser:
        """A fresh per-request parser (never shared between requests or choices)."""
        return NativeCallParser(self, request_id, attempt=attempt, on_call=on_call)


def _literal(text: str) -> str:
    """An EBNF string literal of ``text``."""
    return json.dumps(text)


def _json_content(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tag's JSON content: the schema, with at most one whitespace character in a row (the layout the
    templates render, ``", "`` and ``": "``; unbounded whitespace lets a weak model pad forever)."""
    return {"type": "json_schema", "json_schema": dict(schema), "max_whitespace_cnt": JSON_MAX_WHITESPACE}


def _call_with_object_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            pass
    return {**call, "type": "function", "function": function}


def _call_object(value: Any, arguments_keys: tuple[str, ...]) -> tuple[str, str | None] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    for key in arguments_keys:
        if key in value:
            return value["name"], json.dumps(value[key], ensure_ascii=False)
    return value["name"], None


def _join_content(pieces: Sequence[str]) -> str | None:
    text = "".join(pieces).strip()
    return text or None


class JsonArrayFormat(ToolFormat):
    """The platform's own ``[{"name", "arguments"}]`` (SmolLM2 and every template without tools).

    It keeps the decider's older path: the prompt says what to write, :func:`decider.schema.tool_calls_schema`
    is the constraint and :class:`decider.parser.ToolCallStreamParser` the parser (:meth:`scan` reads a whole
    text the same way, for clients' ``raw_output``)."""

    name = "json_array"
    native = False

    def detect(self, template: str) -> bool:
        return True

    def scan(self, text: str) -> Scan:
        parsed = parse_output(text, request_id="scan")
        calls = [ScannedCall(call.name, call.raw_arguments, end) for call, end in zip(parsed.tool_calls, parsed.call_ends)]
        return Scan(calls=calls, content=parsed.content, problem=parsed.problem)


class HermesFormat(ToolFormat):
    """Hermes / Qwen2.5: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks, results
    in ``<tool_response>`` (the template turns ``tool`` messages into them)."""

    name = "hermes"
    BEGIN, END = "<tool_call>", "</tool_call>"

    def detect(self, template: str) -> bool:
        return self.BEGIN in template

    def tags(self, tools, *, max_calls, calls_schema):
        return [self.BEGIN], [{"type": "tag", "begin": f'{self.BEGIN}\n{{"name": "{name}", "arguments": ',
                               "content": _json_content(parameters),
                               "end": f"}}\n{self.END}"} for name, parameters in tools]

    def scan(self, text: str) -> Scan:
        scan, outside, pos = Scan(), [], 0
        while (start := text.find(self.BEGIN, pos)) >= 0:
            outside.append(text[pos:start])
            body_start = start + len(self.BEGIN)
            stop = text.find(self.END, body_start)
            body = text[body_start:] if stop < 0 else text[body_start:stop]
            try:
                value = json.loads(body)
            except ValueError:
                value = None
            found = _call_object(value, ("arguments", "parameters"))
            if stop < 0:
                name = _open_call_name(body)
                if name is not None:
                    scan.calls.append(ScannedCall(name, None, None))
                scan.problem = f"a {self.BEGIN} block is not closed"
                pos = len(text)
                break
            if found is None:
                scan.problem = f"a {self.BEGIN} block is not a JSON call object"
            else:
                scan.calls.append(ScannedCall(found[0], found[1], stop + len(self.END)))
            pos = stop + len(self.END)
        outside.append(text[pos:])
        scan.content = _join_content(outside)
        return scan


class Llama3JsonFormat(ToolFormat):
    """Llama 3.1+ JSON tool calling: ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``,
    several separated by ``;``), results in the ``ipython`` role (the template maps ``tool`` to it)."""

    name = "llama3_json"
    TRIGGER = '{"name": "'
    separator = "; "
    PYTHON_TAG = "<|python_tag|>"

    def detect(self, template: str) -> bool:
        return "<|start_header_id|>" in template and '"parameters"' in template

    def tags(self, tools, *, max_calls, calls_schema):
        return [self.TRIGGER], [{"type": "tag", "begin": f'{{"name": "{name}", "parameters": ',
                                 "content": _json_content(parameters), "end": "}"}
                                for name, parameters in tools]

    def template_messages(self, messages):
        out: list[dict[str, Any]] = []
        for message in super().template_messages(messages):
            calls = message.get("tool_calls") or []
            if len(calls) > 1:  # the family's template takes one call per assistant turn
                out.extend({**message, "content": message["content"] if i == 0 else "", "tool_calls": [call]}
                           for i, call in enumerate(calls))
            else:
                out.append(message)
        return out

    def scan(self, text: str) -> Scan:
        scan, outside, pos = Scan(), [], 0
        decoder = json.JSONDecoder()
        pattern = re.compile(r'\{\s*"name"\s*:')
        while (match := pattern.search(text, pos)) is not None:
            start = match.start()
            outside.append(text[pos:start].replace(self.PYTHON_TAG, ""))
            try:
                value, end = decoder.raw_decode(text, start)
            except ValueError:
                name = _open_call_name(text[start:])
                if name is not None:
                    scan.calls.append(ScannedCall(name, None, None))
                scan.problem = "a call object is not complete JSON"
                pos = len(text)
                break
            found = _call_object(value, ("parameters", "arguments"))
            if found is None:
                scan.problem = "a JSON object names no tool"
            else:
                scan.calls.append(ScannedCall(found[0], found[1], end))
            pos = end
            rest = text[pos:].lstrip()
            if rest.startswith(";"):  # the family's separator between calls
                pos = len(text) - len(rest) + 1
        outside.append(text[pos:].replace(self.PYTHON_TAG, ""))
        scan.content = _join_content(outside)
        return scan


class MistralFormat(ToolFormat):
    """Mistral (v0.3 template): ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``, results in
    ``[TOOL_RESULTS]`` with a 9-character call id (the template refuses any other id)."""

    name = "mistral"
    MARKER = "[TOOL_CALLS]"
    one_block = True

    def detect(self, template: str) -> bool:
        return self.MARKER in template

    def tags(self, tools, *, max_calls, calls_schema):
        return [self.MARKER], [{"type": "tag", "begin": self.MARKER + " ",
                                "content": _json_content(calls_schema), "end": ""}]

    @staticmethod
    def short_id(value: Any) -> str:
        """A stable 9-character alphanumeric id for any call id (the template's rule)."""
        return hashlib.sha256(str(value).encode()).hexdigest()[:9]

    def template_messages(self, messages):
        out = super().template_messages(messages)
        for message in out:
            if message.get("tool_calls"):
                message["tool_calls"] = [{**call, "id": self.short_id(call.get("id"))} for call in message["tool_calls"]]
            if message.get("role") == "tool":
                message["tool_call_id"] = self.short_id(message.get("tool_call_id"))
        return out

    def scan(self, text: str) -> Scan:
        start = text.find(self.MARKER)
        body_at = start + len(self.MARKER) if start >= 0 else None
        if body_at is None and text.lstrip().startswith('[{"name"'):
            body_at = start = len(text) - len(text.lstrip())  # the marker was dropped by a server's detokenizer
        if body_at is None:
            return Scan(content=_join_content([text]))
        scan = Scan()
        body = text[body_at:].lstrip()
        offset = len(text) - len(body)
        try:
            value, end = json.JSONDecoder().raw_decode(body)
        except ValueError:
            scan.problem = f"the calls after {self.MARKER} are not complete JSON"
            value, end = None, None
            name = _open_call_name(body.lstrip("[ "))
            if name is not None:
                scan.calls.append(ScannedCall(name, None, None))
        if value is not None:
            items = value if isinstance(value, list) else [value]
            for item in items:
                found = _call_object(item, ("arguments", "parameters"))
                if found is None:
                    scan.problem = f"an entry after {self.MARKER} names no tool"
                    continue
                scan.calls.append(ScannedCall(found[0], found[1], offset + end))
        scan.content = _join_content([text[:start], body[end:] if end is not None else ""])
        return scan


def _open_call_name(body: str) -> str | None:
    match = re.search(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
    return json.loads(f'"{match.group(1)}"') if match else None


#: The registered formats by name, most specific detection first; ``json_array`` matches any template.
TOOL_FORMATS: dict[str, ToolFormat] = {fmt.name: fmt for fmt in (MistralFormat(), HermesFormat(), Llama3JsonFormat(),
                                                                  JsonArrayFormat())}


def get_tool_format(name: str) -> ToolFormat:
    """The registered format ``name`` (a clear error for an unknown one)."""
    try:
        return TOOL_FORMATS[name]
    except KeyError:
        raise InvalidRequestError(f"unknown tool-call format {name!r}; known: {sorted(TOOL_FORMATS)}") from None


def detect_tool_format(template: str | None) -> ToolFormat:
    """The format a chat template writes calls in; ``json_array`` when it renders no tools."""
    if not isinstance(template, str) or "tools" not in template:
        return TOOL_FORMATS[DEFAULT_TOOL_FORMAT]
    return next(fmt for fmt in TOOL_FORMATS.values() if fmt.detect(template))


def resolve_tool_format(tokenizer: Any, *, override: str | None = None, model_dir: str | Path | None = None) -> ToolFormat:
    """The format for a model: ``override``, else its manifest's ``tool_call_format``, else detected from
    its chat template."""
    if override:
        return get_tool_format(override)
    directory = model_dir or getattr(tokenizer, "name_or_path", None)
    if directory:
        manifest = Path(directory) / MANIFEST_FILENAME
        if manifest.is_file():
            named = json.loads(manifest.read_text(encoding="utf-8")).get(MANIFEST_KEY)
            if named:
                return get_tool_format(named)
    return detect_tool_format(getattr(tokenizer, "chat_template", None))


def read_native_calls(text: str) -> tuple[str, list[dict[str, Any]]] | None:
    """A client's raw output read in the native syntax whose marks it carries (``[TOOL_CALLS]``,
    ``<|python_tag|>`` or ``{"name": ..., "parameters": ...}``): ``(format name, calls)`` with each call's
    ``name``, ``arguments`` (an object, or None) and ``raw_arguments``. None when it carries none, or when its
    reading is not whole (a broken body): the cleaning reader of :func:`tools.check.check_output` then takes the
    text, repairs included, so nothing is dropped. ``<tool_call>`` blocks are that reader's already."""
    claims = (("mistral", MistralFormat.MARKER in text),
              ("llama3_json", Llama3JsonFormat.PYTHON_TAG in text or re.search(r'"parameters"\s*:', text) is not None))
    for name, claimed in claims:
        if not claimed:
            continue
        scan = TOOL_FORMATS[name].scan(text)
        if scan.calls and scan.problem is None:
            parser = NativeCallParser(TOOL_FORMATS[name], "client")
            return name, [{"name": c.name, "arguments": parser._call(i, c).arguments, "raw_arguments": c.raw_arguments}
                          for i, c in enumerate(scan.calls)]
    return None


class NativeCallParser:
    """Per-request incremental reader of one format's output: feed text, get a delta per call as it closes.

    Call ids and indices count within this request (``call_<request_id>_<n>``), as the JSON-array parser's do.
    """

    def __init__(self, fmt: ToolFormat, request_id: str, *, attempt: int = 0, on_call: OnCall | None = None) -> None:
        self.format = fmt
        self.request_id = request_id
        self.attempt = attempt
        self._on_call = on_call
        self._text = ""
        self._told = 0

    @property
    def text(self) -> str:
        return self._text

    def _call(self, index: int, scanned: ScannedCall) -> ToolCall:
        arguments = None
        if scanned.raw_arguments is not None:
            try:
                arguments = json.loads(scanned.raw_arguments)
            except ValueError:
                arguments = None
        return ToolCall(id=call_id(self.request_id, index, attempt=self.attempt), index=index, name=scanned.name,
                        arguments=arguments if isinstance(arguments, dict) else None, raw_arguments=scanned.raw_arguments)

    def feed(self, chunk: str) -> list[ToolCallDelta]:
        """Consume more text; one delta (name and whole arguments) for each call that closed."""
        self._text += chunk
        closed = [c for c in self.format.scan(self._text).calls if c.end is not None]
        deltas = []
        for index in range(self._told, len(closed)):
            call = self._call(index, closed[index])
            deltas.append(ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.raw_arguments or ""))
            if self._on_call is not None:
                self._on_call(call)
        self._told = max(self._told, len(closed))
        return deltas

    def finish(self) -> ParsedOutput:
        """The whole text read as a decision."""
        scan = self.format.scan(self._text)
        calls = [self._call(i, c) for i, c in enumerate(scan.calls)]
        closed = [call for call, c in zip(calls, scan.calls) if c.end is not None and call.arguments is not None]
        if not self._text.strip():
            return ParsedOutput(content=self._text, problem="empty output")
        return ParsedOutput(tool_calls=calls, content=scan.content if not calls else None, problem=scan.problem,
                            closed_calls=closed, call_ends=[c.end for c in scan.calls])
