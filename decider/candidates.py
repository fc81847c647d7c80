"""Typed candidates: narrow declared-shape fields to the values the conversation holds.

The legitimate help for a small model: a field whose schema declares a shape (``pattern``,
``format``), an ``enum``, a declared vocabulary (``x-aliases``) or a number may be narrowed, for
one request, to the candidates the conversation and earlier tool results hold — spans that match
the declared shape, numbers that fit the field's bounds, enum or vocabulary values the text names
(or names by a declared alias). Everything comes from the tool's spec and the conversation;
nothing from word lists.

What this never does: narrow free text, fix the number of calls, drop a tool, or close a field
that has no candidate (it stays open under its schema, so "March 12 2025 at 10am" still reaches
a ``date-time`` field, written in its format by the model). Every narrowing is returned in
:attr:`Narrowing.narrowed` and recorded on the decision.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from decider.prompt import FEEDBACK_NAME
from tools.errors import PatternBudgetError, UnsupportedPatternError
from tools.evidence import DEFAULT_ROLES, ConversationValues, conversation_text
from tools.field_support import unit_candidates
from tools.patterns import compile_pattern
from tools.schema_walk import declared_types
from tools.spec import ToolSpec
from tools.validator import validate

__all__ = ["MAX_CANDIDATES", "Narrowing", "narrow_tools"]

#: A field with more candidates than this stays open (the conversation is then no narrowing).
MAX_CANDIDATES = 12

#: Spans of a declared ``format``: linear-time expressions of our own, never the client's.
_FORMAT_SPANS = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "date-time": r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})?",
    "time": r"\d{2}:\d{2}(?::\d{2})?",
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": r"(?:\d{1,3}\.){3}\d{1,3}",
    "uri": r"https?://[^\s\"'<>]+",
}


@dataclass
class Narrowing:
    """Per-tool parameter schemas for one request, and what was narrowed to what."""

    parameters: dict[str, Mapping[str, Any]]
    #: ``{tool: {field path: [candidates]}}``
    narrowed: dict[str, dict[str, list[Any]]] = field(default_factory=dict)


def _unanchored(pattern: str) -> str:
    return re.sub(r"(?<!\\)\$$", "", pattern[1:] if pattern.startswith("^") else pattern)


def _bounded(text: str, start: int, end: int) -> bool:
    """The span is not cut out of a longer word or number."""
    before = text[start - 1] if start else " "
    after = text[end] if end < len(text) else " "
    return not (before.isalnum() and text[start].isalnum()) and not (after.isalnum() and text[end - 1].isalnum())


def _spans(pattern: str, text: str) -> list[str]:
    """Bounded spans of ``text`` matching ``pattern`` (RE2, linear time); none when the pattern
    cannot run or its match budget is spent — the field then stays open, never an error."""
    try:
        compiled = compile_pattern(_unanchored(pattern))
        return [span for start, end, span in compiled.finditer(text) if span and _bounded(text, start, end)]
    except (UnsupportedPatternError, PatternBudgetError):
        return []


def _number_fits(value: float, node: Mapping[str, Any]) -> bool:
    if "integer" in declared_types(node) and not float(value).is_integer():
        return False
    return not validate(int(value) if float(value).is_integer() else value, {k: v for k, v in node.items()
                                                                             if not k.startswith("x-")})


def _candidates(node: Mapping[str, Any], raw: str, values: ConversationValues) -> list[Any] | None:
    """The values this field may take in this request, or None to leave it open."""
    types = declared_types(node)
    if "enum" in node:
        aliases = node.get("x-aliases") if isinstance(node.get("x-aliases"), Mapping) else {}
        named = [v for v in node["enum"] if isinstance(v, str) and values.has_text(v)
                 or any(canonical == v and values.has_text(alias) for alias, canonical in aliases.items())]
        return named or None
    if types == {"string"} and isinstance(node.get("x-aliases"), Mapping) and not ({"pattern", "format"} & set(node)):
        # a string field with a declared vocabulary (canonical values and their aliases): the
        # canonical values the conversation names, by themselves or by an alias
        aliases = node["x-aliases"]
        named = [c for c in dict.fromkeys(aliases.values()) if isinstance(c, str) and (values.has_text(c) or any(
            canonical == c and values.has_text(alias) for alias, canonical in aliases.items()))]
        return named or None
    if types & {"number", "integer"} and not types & {"string", "object", "array"}:
        in_unit = unit_candidates(node, values)  # "5 dollars" offers 500 to a field of cents, not 5
        found = sorted(n for n in (values.numbers if in_unit is None else in_unit) if _number_fits(n, node))
        return [int(n) if "integer" in types or n.is_integer() else n for n in found] or None
    if types == {"string"} and ("pattern" in node or node.get("format") in _FORMAT_SPANS):
        regex = node.get("pattern") or _FORMAT_SPANS[node["format"]]
        found = list(dict.fromkeys(_spans(regex, raw)))
        check = {k: v for k, v in node.items() if not k.startswith("x-")}
        return [span for span in found if not validate(span, check)] or None
    return None


def _narrow(node: Any, raw: str, values: ConversationValues, path: str, out: dict[str, list[Any]]) -> Any:
    if not isinstance(node, Mapping) or "$ref" in node:
        return node
    if "object" in declared_types(node) and isinstance(node.get("properties"), Mapping):
        props = {name: _narrow(sub, raw, values, f"{path}/{name}", out) for name, sub in node["properties"].items()}
        return {**node, "properties": props} if any(props[n] is not node["properties"][n] for n in props) else node
    if "array" in declared_types(node) and isinstance(node.get("items"), Mapping):
        items = _narrow(node["items"], raw, values, f"{path}/*", out)
        if items is node["items"]:
            return node
        if f"{path}/*" not in out:  # narrowed inside each item (an array of objects or of arrays): bounds kept
            return {**node, "items": items}
        # more items than distinct candidates can only repeat one: bound the array by them
        distinct = len(out[f"{path}/*"])
        bound = min(node.get("maxItems", distinct), max(distinct, node.get("minItems", 0)))
        return {**node, "items": items, "maxItems": bound}
    candidates = _candidates(node, raw, values)
    if not candidates or len(candidates) > MAX_CANDIDATES:
        return node
    out[path] = candidates
    narrowed = {k: v for k, v in node.items() if k in ("type", "description", "title")}
    narrowed["enum"] = candidates
    return narrowed


def narrow_tools(tools: Sequence[ToolSpec], messages: Sequence[Mapping[str, Any]], *,
                 roles: Sequence[str] = DEFAULT_ROLES) -> Narrowing:
    """Each tool's parameters with declared-shape fields narrowed to the conversation's candidates.

    A tool with nothing narrowed keeps its own ``parameters`` object (identity), so callers can
    use the cached base grammar for it.
    """
    # the platform's re-ask feedback quotes rejected values and allowed ones alike: never evidence
    raw = conversation_text(messages, roles=roles, exclude_name=FEEDBACK_NAME)
    values = ConversationValues.from_text(raw)
    result = Narrowing(parameters={})
    for spec in tools:
        found: dict[str, list[Any]] = {}
        narrowed = _narrow(spec.parameters, raw, values, "", found)
        if found:
            result.narrowed[spec.name] = found
            result.parameters[spec.name] = copy.deepcopy(narrowed) if narrowed is not spec.parameters else narrowed
        else:
            result.parameters[spec.name] = spec.parameters
    return result
