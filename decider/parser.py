"""Decoded text → tool calls, whole or streamed, bound to one request.

The constraint makes the model write ``[{"name": "...", "arguments": {...}}, ...]`` (or
``{"content": "..."}`` when it answers in text). :class:`ToolCallStreamParser` scans that text
as it arrives and emits OpenAI-style deltas; :func:`parse_output` runs the same parser over a
whole text, so streamed and non-streamed results agree by construction.

A parser is a per-request object: it carries the request id, and every call it produces gets
``id = call_<request_id>_<n>`` and ``index = n`` counting within that request only. Every delta
carries its call's ``index`` (the wire form, :meth:`ToolCallDelta.to_openai`, sends ``id`` in the
first only); two calls to the same function get different indices. Never share a parser between
requests or choices (vLLM #38158, #39214 are that bug).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tools.calls import ToolCall, call_id

__all__ = ["OnCall", "ParsedOutput", "ToolCallDelta", "ToolCallStreamParser", "parse_output"]

#: Told of each call the moment its JSON object closes (arguments parsed; None when not a JSON object).
OnCall = Callable[[ToolCall], None]

_WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed piece of one tool call."""

    index: int
    id: str
    #: The function name, on the first delta of the call only (clients concatenate names).
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The ``choices[].delta.tool_calls[]`` entry: ``id``, ``type`` and ``function.name`` on the call's first
        delta only, as OpenAI streams them (clients concatenate every string field they receive again)."""
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedOutput:
    """A decoded text read as a decision: tool calls, or a text answer."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    #: Why the text is not a complete decision (truncated JSON, unexpected shape); None when it is.
    problem: str | None = None
    #: The calls whose JSON object closed, arguments an object: what a text cut at a bound still holds whole.
    closed_calls: list[ToolCall] = field(default_factory=list)
    #: For each of ``tool_calls``, the text offset just past its closing brace (None: it never closed).
    call_ends: list[int | None] = field(default_factory=list)


@dataclass
class _Element:
    index: int
    start: int
    key: str | None = None
    expecting: str = "key"  # key | colon | value | comma
    value_start: int | None = None
    value_depth: int = 0
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    args_emitted: int = 0
    announced: bool = False
    closed: bool = False
    #: Offset just past the call object's closing brace, once closed.
    end: int | None = None


class ToolCallStreamParser:
    """Incremental parser of one request's decoded output. Feed text, collect deltas."""

    def __init__(self, request_id: str, *, attempt: int = 0, on_call: OnCall | None = None) -> None:
        self.request_id = request_id
        self.attempt = attempt
        self._on_call = on_call
        self._text = ""
        self._pos = 0
        self._stack: list[str] = []
        self._in_string = False
        self._escape = False
        self._string_start = 0
        self._mode: str | None = None  # "calls" (top-level array) | "object" | "text"
        self._elements: list[_Element] = []
        self._current: _Element | None = None
        self._done = False

    @property
    def text(self) -> str:
        """Everything fed so far."""
        return self._text

    def call_id(self, index: int) -> str:
        """The id of this request's ``index``-th call."""
        return call_id(self.request_id, index, attempt=self.attempt)

    def feed(self, chunk: str) -> list[ToolCallDelta]:
        """Consume more decoded text; return the deltas it completes."""
        self._text += chunk
        deltas: list[ToolCallDelta] = []
        text = self._text
        while self._pos < len(text):
            char = text[self._pos]
            self._step(char, self._pos, deltas)
            self._pos += 1
        if self._current is not None:
            self._flush_arguments(self._current, len(text), deltas)
        return deltas

    def _step(self, char: str, pos: int, deltas: list[ToolCallDelta]) -> None:
        if self._mode is None:
            if char in _WHITESPACE:
                return
            self._mode = {"[": "calls", "{": "object"}.get(char, "text")
        if self._mode != "calls" or self._done:
            return
        element = self._current
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                if element is not None and len(self._stack) == 2:
                    self._string_done(element, self._text[self._string_start:pos + 1])
            return
        if char == '"':
            self._in_string = True
            self._string_start = pos
            if element is not None and len(self._stack) == 2 and element.expecting == "value":
                self._value_begins(element, pos)
            return
        if char in "[{":
            self._stack.append(char)
            depth = len(self._stack)
            if depth == 2 and char == "{":
                element = _Element(index=len(self._elements), start=pos)
                self._elements.append(element)
                self._current = element
            elif depth == 3 and element is not None and element.expecting == "value":
                self._value_begins(element, pos)
            return
        if char in "]}":
            if self._stack:
                self._stack.pop()
            depth = len(self._stack)
            if element is not None:
                if depth == 2 and element.expecting == "in-value":
                    self._value_ends(element, pos + 1, deltas)
                elif depth == 1 and char == "}":
                    if element.expecting == "in-value":
                        self._value_ends(element, pos, deltas)
                    element.closed, element.end = True, pos + 1
                    self._finish_element(element, deltas)
                    self._current = None
                    if self._on_call is not None and element.name is not None:
                        self._on_call(self._call(element))
            if depth == 0:
                self._done = True
            return
        if element is not None and len(self._stack) == 2:
            if char == ":" and element.expecting == "colon":
                element.expecting = "value"
            elif char == ",":
                if element.expecting == "in-value":
                    self._value_ends(element, pos, deltas)
                element.expecting = "key"
            elif char not in _WHITESPACE and element.expecting == "value":
                self._value_begins(element, pos)  # a bare number or literal

    def _value_begins(self, element: _Element, pos: int) -> None:
        element.expecting = "in-value"
        element.value_start = pos
        if element.key == "arguments":
            element.args_start = pos
            element.args_emitted = pos

    def _string_done(self, element: _Element, literal: str) -> None:
        if element.expecting == "key":
            element.key = _loads_or(literal, None)
            element.expecting = "colon"
        elif element.expecting == "in-value" and element.value_start == self._string_start:
            if element.key == "name":
                element.name = _loads_or(literal, None)
            self._value_ends(element, self._pos + 1, None)

    def _value_ends(self, element: _Element, end: int, deltas: list[ToolCallDelta] | None) -> None:
        if element.key == "arguments" and element.args_start is not None and element.args_end is None:
            element.args_end = end
        element.expecting = "comma"
        if deltas is not None:
            self._flush_arguments(element, end, deltas)

    def _flush_arguments(self, element: _Element, upto: int, deltas: list[ToolCallDelta]) -> None:
        """Emit the call header once its name is known, then any new argument text."""
        if element.name is None:
            return
        if not element.announced:
            element.announced = True
            fragment = ""
            if element.args_start is not None:
                stop = element.args_end if element.args_end is not None else upto
                fragment = self._text[element.args_start:stop].rstrip(_WHITESPACE) if element.args_end is None else self._text[element.args_start:stop]
                element.args_emitted = element.args_start + len(fragment)
            deltas.append(ToolCallDelta(index=element.index, id=self.call_id(element.index), name=element.name, arguments=fragment))
            return
        if element.args_start is None:
            return
        stop = element.args_end if element.args_end is not None else upto
        if element.args_end is None:
            stop = element.args_start + len(self._text[element.args_start:stop].rstrip(_WHITESPACE))
        if stop > element.args_emitted:
            deltas.append(ToolCallDelta(index=element.index, id=self.call_id(element.index),
                                        arguments=self._text[element.args_emitted:stop]))
            element.args_emitted = stop

    def _finish_element(self, element: _Element, deltas: list[ToolCallDelta]) -> None:
        self._flush_arguments(element, element.args_end or self._pos, deltas)

    def _call(self, element: _Element) -> ToolCall:
        raw = None
        if element.args_start is not None:
            raw = self._text[element.args_start:element.args_end if element.args_end is not None else len(self._text)]
        arguments = _loads_or(raw, None) if raw is not None else None
        return ToolCall(id=self.call_id(element.index), index=element.index, name=element.name or "",
                        arguments=arguments if isinstance(arguments, dict) else None, raw_arguments=raw)

    def finish(self) -> ParsedOutput:
        """Read the whole text as a decision (call after the last ``feed``)."""
        text = self._text.strip()
        if self._mode in (None, "text"):
            return ParsedOutput(content=self._text, problem=None if self._mode else "empty output")
        if self._mode == "object":
            try:
                value = json.loads(text)
            except ValueError as exc:
                return ParsedOutput(content=None, problem=f"output is not complete JSON: {exc}")
            if isinstance(value, dict) and set(value) == {"content"} and isinstance(value["content"], str):
                return ParsedOutput(content=value["content"])
            if isinstance(value, dict) and isinstance(value.get("name"), str):
                raw = json.dumps(value.get("arguments"), ensure_ascii=False)
                call = ToolCall(id=self.call_id(0), index=0, name=value["name"], raw_arguments=raw,
                                arguments=value.get("arguments") if isinstance(value.get("arguments"), dict) else None)
                return ParsedOutput(tool_calls=[call])
            return ParsedOutput(problem="output is a JSON object that is neither a text answer nor a tool call")
        named = [element for element in self._elements if element.name is not None]
        calls = [self._call(element) for element in named]
        closed = [call for call, element in zip(calls, named) if element.closed and call.arguments is not None]
        problem = None
        if not self._done:
            problem = "output ended before the tool-call array was closed"
        elif any(not e.closed or e.name is None for e in self._elements):
            problem = "a tool call has no name or is incomplete"
        return ParsedOutput(tool_calls=calls, problem=problem, closed_calls=closed, call_ends=[e.end for e in named])


def _loads_or(text: str | None, default: Any) -> Any:
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def parse_output(text: str, *, request_id: str, attempt: int = 0) -> ParsedOutput:
    """Parse a whole decoded text (same parser as streaming)."""
    parser = ToolCallStreamParser(request_id, attempt=attempt)
    parser.feed(text)
    return parser.finish()
