"""Declared grounding: which argument values must come from the conversation, and the check.

A tool author marks a field ``"x-grounded": true`` when its value must be stated in the
conversation or returned by an earlier tool (account numbers, order ids, amounts, recipients),
or lists field names in ``"x-grounded": [...]`` on the parameters object. For tools with
``side_effects``, numbers and strings that declare a ``pattern``, ``format`` or ``enum`` are
grounded by default; free-text strings are not; ``"x-grounded": false`` opts a field out.

The check runs after decoding, for every backend, and never changes a call: it reports each
grounded value the conversation does not support (:func:`check_grounding`). The caller decides
what happens (the decider's re-ask loop re-asks once with the reason, then sends the job to
review). A value is supported when it occurs in the evidence after normalization
(:mod:`tools.evidence`): the text itself, a declared alias of it (``x-aliases``), the number in
digits or words, a date whose parts are all stated, or the field's own default.

Provenance (:func:`provenance`): each grounded value with every source that states it (the user,
a tool's result — which tool, whether an MCP tool —, the platform). Tool output is untrusted
input: a value only tool results state does not authorize a side effect by itself
(:func:`untrusted`), unless the tool's author (``ToolSpec.trusted_output``) or the tenant trusts that
tool; the run loop then holds the call for a person, showing them this record.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tools.evidence import PLATFORM, ConversationValues, Source
from tools.schema_walk import declared_types, pointer, subschemas

__all__ = ["Finding", "check_grounding", "declaration_errors", "grounded_paths", "provenance", "untrusted"]

Finding = dict[str, Any]

_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?")
_TIME = re.compile(r"^(\d{2}):(\d{2})(?::(\d{2}))?")


def _resolve(node: Any, root: Mapping[str, Any]) -> Any:
    """Follow a local ``$ref`` (``#/$defs/X``); other nodes come back as they are."""
    seen = 0
    while isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/") and seen < 16:
        target: Any = root
        for part in node["$ref"][2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, Mapping) else {}
        node, seen = target, seen + 1
    return node


def _default_grounded(node: Mapping[str, Any]) -> bool:
    types = declared_types(node, inferred=True)
    if types & {"number", "integer"}:
        return True
    return "string" in types and any(k in node for k in ("pattern", "format", "enum", "const"))


def _leaves(node: Any, root: Mapping[str, Any], path: str, listed: frozenset[str], side_effects: bool,
            inherited: bool | None) -> Iterator[tuple[str, Mapping[str, Any]]]:
    node = _resolve(node, root)
    if not isinstance(node, Mapping):
        return
    own = node.get("x-grounded")
    marked = own if isinstance(own, bool) else inherited
    types = declared_types(node, inferred=True)
    if "object" in types or "properties" in node:
        local = frozenset(own) if isinstance(own, list) else frozenset()
        for name, sub in (node.get("properties") or {}).items():
            flag = True if name in listed | local else marked
            yield from _leaves(sub, root, f"{path}/{name}", frozenset(), side_effects, flag)
        return
    if "array" in types:
        yield from _leaves(node.get("items", {}), root, f"{path}/*", frozenset(), side_effects, marked)
        return
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and any("object" in declared_types(_resolve(b, root), inferred=True)
                                               for b in branches):
            for branch in branches:
                yield from _leaves(branch, root, path, frozenset(), side_effects, marked)
            return
    if marked is True or (marked is None and side_effects and _default_grounded(node)):
        yield path, node


def grounded_paths(parameters: Mapping[str, Any], *, side_effects: bool) -> dict[str, Mapping[str, Any]]:
    """``{path: leaf schema}`` of every grounded field; array items appear as ``*`` (``/items/*/sku``)."""
    listed = parameters.get("x-grounded")
    listed = frozenset(listed) if isinstance(listed, list) else frozenset()
    return dict(_leaves(parameters, parameters, "", listed, side_effects, None))


def declaration_errors(parameters: Mapping[str, Any]) -> list[str]:
    """Problems with a schema's ``x-grounded`` declarations (a listed field that does not exist)."""
    errors = []
    for path, node in subschemas(parameters):
        flag = node.get("x-grounded")
        props = node.get("properties") if isinstance(node.get("properties"), Mapping) else {}
        names = isinstance(flag, list) and all(isinstance(name, str) for name in flag)
        if flag is not None and not (isinstance(flag, bool) or names):
            errors.append(f"{path or '/'}: x-grounded must be true, false or a list of field names")
        elif isinstance(flag, list):
            errors += [f"{pointer(path, name)}: x-grounded names a field that does not exist"
                       for name in flag if name not in props]
    return errors


def _values_at(value: Any, parts: list[str], path: str = "") -> Iterator[tuple[str, Any]]:
    if not parts:
        yield path or "/", value
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _values_at(item, rest, f"{path}/{index}")
    elif isinstance(value, Mapping) and head in value:
        yield from _values_at(value[head], rest, f"{path}/{head}")


def _date_supported(value: str, evidence: ConversationValues) -> bool:
    """Every part of an ISO date/time is stated: written the same way, or as numbers and month names."""
    date = _DATE.match(value)
    clock = _TIME.match(value[11:] if date else value)
    if date is None and clock is None:
        return False
    if date is not None and value[:10] not in evidence.text:
        year, month, day = (int(p) for p in date.groups()[:3])
        if not (evidence.has_number(year) or str(year) in evidence.text):
            return False
        if not (evidence.has_number(month) or month in evidence.months) or not evidence.has_number(day):
            return False
    if clock is None or clock.group(0)[:5] in evidence.text:
        return True
    hour, minute = int(clock.group(1)), int(clock.group(2))
    if hour and not (evidence.has_number(hour) or hour > 12 and evidence.has_number(hour - 12)):
        return False
    return minute == 0 or evidence.has_number(minute)


def _needs_no_evidence(value: Any, leaf: Mapping[str, Any]) -> bool:
    """The tool's own schema supports it: the field's default, or ``false`` (a flag not set)."""
    return ("default" in leaf and leaf["default"] == value) or value is False


def _supported(value: Any, leaf: Mapping[str, Any], name: str, evidence: ConversationValues) -> bool:
    return _needs_no_evidence(value, leaf) or _stated(value, leaf, name, evidence)


def _stated(value: Any, leaf: Mapping[str, Any], name: str, evidence: ConversationValues) -> bool:
    if isinstance(value, bool):
        words = [w for w in re.split(r"[_\W]+", name.casefold()) if len(w) >= 3]
        return any(evidence.has_text(w) for w in words)
    if isinstance(value, (int, float)):
        return evidence.has_number(float(value))
    if not isinstance(value, str):
        return False
    if evidence.has_text(value):
        return True
    aliases = leaf.get("x-aliases")
    if isinstance(aliases, Mapping) and any(canonical == value and evidence.has_text(alias)
                                             for alias, canonical in aliases.items()):
        return True
    return leaf.get("format") in ("date", "date-time", "time") and _date_supported(value, evidence)


def check_grounding(parameters: Mapping[str, Any], arguments: Mapping[str, Any], evidence: ConversationValues, *,
                    side_effects: bool) -> list[Finding]:
    """Every grounded value of ``arguments`` the evidence does not support, as findings.

    A finding is ``{path, value, message, validator: "grounded"}``; an empty list means every
    grounded value is supported (or the tool grounds nothing).
    """
    findings = []
    for pattern, leaf in grounded_paths(parameters, side_effects=side_effects).items():
        name = pattern.rstrip("/*").rsplit("/", 1)[-1]
        for path, value in _values_at(arguments, [p for p in pattern.split("/") if p]):
            items = value if isinstance(value, list) else [value]
            for item in items:
                if item is None or _supported(item, leaf, name, evidence):
                    continue
                findings.append({"path": path, "value": item, "validator": "grounded",
                                 "message": f"{item!r} is not stated in the conversation or an earlier tool result "
                                            f"({name} must come from there; ask the user for it instead of guessing)"})
    return findings


def _grounded_values(parameters: Mapping[str, Any], arguments: Mapping[str, Any], *,
                     side_effects: bool) -> Iterator[tuple[str, Any, Mapping[str, Any], str]]:
    """``(path, value, leaf schema, field name)`` of every grounded value in ``arguments``."""
    for pattern, leaf in grounded_paths(parameters, side_effects=side_effects).items():
        name = pattern.rstrip("/*").rsplit("/", 1)[-1]
        for path, value in _values_at(arguments, [p for p in pattern.split("/") if p]):
            for item in value if isinstance(value, list) else [value]:
                if item is not None:
                    yield path, item, leaf, name


def provenance(parameters: Mapping[str, Any], arguments: Mapping[str, Any],
               sources: Sequence[tuple[Source, ConversationValues]], *, side_effects: bool) -> list[dict[str, Any]]:
    """Every grounded value of ``arguments`` with the sources that state it, as recorded on a call:
    ``{path, value, sources: [Source.public()...], trusted}``; ``trusted``: a trusted source states it (the user,
    the platform, a tool whose results are trusted). A value no source states has ``sources: []``."""
    entries = []
    for path, value, leaf, name in _grounded_values(parameters, arguments, side_effects=side_effects):
        found = [PLATFORM] if _needs_no_evidence(value, leaf) else []
        found += [source for source, values in sources if _stated(value, leaf, name, values)]
        entries.append({"path": path, "value": value, "sources": [source.public() for source in found],
                        "trusted": any(source.trusted for source in found)})
    return entries


def untrusted(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The entries of :func:`provenance` that only untrusted tool results state: they cannot authorize a side
    effect by themselves (values stated nowhere are grounding findings, re-asked before this)."""
    return [dict(entry) for entry in entries if entry["sources"] and not entry["trusted"]]
