"""Declared grounding: which argument values must come from the conversation, and the check.

A tool author marks a field ``"x-grounded": true`` when its value must be stated in the
conversation or returned by an earlier tool (account numbers, order ids, amounts, recipients),
or lists field names in ``"x-grounded": [...]`` on the parameters object. For tools with
``side_effects``, numbers and strings that declare a ``pattern``, ``format`` or ``enum`` are
grounded by default; ``"x-grounded": false`` opts a field out. Every other string (and
flag set to true) of a side-effecting tool — free text, nested objects and arrays included — is
*covered*: not a finding when no one states it, but a person sees it before it runs unless the
user stated it (a flag: a word of its name; ``false`` needs nothing).

The check runs after decoding, for every backend, and never changes a call: it reports each
grounded value the conversation does not state *for that field* (:func:`check_grounding`; what
"for that field" means — units, roles, dates, look-alike characters — is :mod:`tools.field_support`).
The caller decides what happens (the decider's re-ask loop re-asks once with the reason, then
sends the job to review).

Provenance (:func:`provenance`): each covered value with every source that states it for its field
(the user, a tool's result — which tool, whether an MCP tool —, the platform) and, where the user's
words leave it unclear, why. Tool output is untrusted input: a value only tool results state does
not authorize a side effect by itself (:func:`untrusted`), unless the tool's author
(``ToolSpec.trusted_output``) or the tenant trusts that tool; nor does a value the user's words leave
unclear (a unit the field does not declare, a role no word gives, free text nobody stated). The run
loop then holds the call for a person, showing them this record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tools.amounts import unit_errors
import regex

from tools.evidence import PLATFORM, ConversationValues, Source, normalize_text
from tools.field_support import ROLES, Field, currency_field, judge
from tools.schema_walk import declared_types, pointer, subschemas

__all__ = ["Finding", "check_grounding", "covered_fields", "declaration_errors", "grounded_paths", "provenance",
           "untrusted"]

Finding = dict[str, Any]
_TOKEN_EDGES = ".,;:!?()[]{}\"'«»“”‘’"


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
            inherited: bool | None, siblings: Mapping[str, Any]) -> Iterator[Field]:
    node = _resolve(node, root)
    if not isinstance(node, Mapping):
        return
    own = node.get("x-grounded")
    marked = own if isinstance(own, bool) else inherited
    types = declared_types(node, inferred=True)
    if "object" in types or "properties" in node:
        local = frozenset(own) if isinstance(own, list) else frozenset()
        properties = node.get("properties") or {}
        resolved = {name: _resolve(sub, root) for name, sub in properties.items()}
        for name, sub in properties.items():
            flag = True if name in listed | local else marked
            yield from _leaves(sub, root, f"{path}/{name}", frozenset(), side_effects, flag, resolved)
        return
    if "array" in types:
        yield from _leaves(node.get("items", {}), root, f"{path}/*", frozenset(), side_effects, marked, siblings)
        return
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and any("object" in declared_types(_resolve(b, root), inferred=True)
                                               for b in branches):
            for branch in branches:
                yield from _leaves(branch, root, path, frozenset(), side_effects, marked, siblings)
            return
    name = path.replace("/*", "").rsplit("/", 1)[-1]
    grounded = marked is True or (marked is None and side_effects and _default_grounded(node))
    if grounded or (marked is None and side_effects and types & {"string", "number", "integer", "boolean"}):
        yield Field(pattern=path, name=name, leaf=node, siblings=siblings, grounded=grounded)


def covered_fields(parameters: Mapping[str, Any], *, side_effects: bool) -> list[Field]:
    """Every field whose values are checked: the grounded ones, and (side effects) every other string, number and
    flag not opted out with ``x-grounded: false`` — nested objects and array items included."""
    listed = parameters.get("x-grounded")
    listed = frozenset(listed) if isinstance(listed, list) else frozenset()
    return list(_leaves(parameters, parameters, "", listed, side_effects, None, {}))


def grounded_paths(parameters: Mapping[str, Any], *, side_effects: bool) -> dict[str, Mapping[str, Any]]:
    """``{path: leaf schema}`` of every grounded field; array items appear as ``*`` (``/items/*/sku``)."""
    return {f.pattern: f.leaf for f in covered_fields(parameters, side_effects=side_effects) if f.grounded}


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
        for name, sub in props.items():
            if isinstance(sub, Mapping):
                errors += unit_errors(pointer(path, name), sub, props)
                if "x-role" in sub and sub["x-role"] not in ROLES:
                    errors.append(f"{pointer(path, name)}: x-role must be one of {', '.join(ROLES)}")
    return errors


def _values_at(value: Any, parts: list[str], path: str = "", parent: Any = None) -> Iterator[tuple[str, Any, Any]]:
    """``(path, value, the object holding it)`` of every value at a pattern path."""
    if not parts:
        yield path or "/", value, parent
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _values_at(item, rest, f"{path}/{index}", parent)
    elif isinstance(value, Mapping) and head in value:
        yield from _values_at(value[head], rest, f"{path}/{head}", value)


def _needs_no_evidence(value: Any, fld: Field, evidence: Iterable[ConversationValues], call: Mapping[str, Any]) -> bool:
    """The tool's own schema supports it: ``false`` (a flag not set), or the field's default when no ``evidence``
    states another value for that field (a default never overrides what the user said: "in euros" against USD)."""
    if value is False:
        return True
    return "default" in fld.leaf and fld.leaf["default"] == value and not any(
        _other_value_stated(value, fld, values, call) for values in evidence)


def _other_value_stated(value: Any, fld: Field, evidence: ConversationValues, call: Mapping[str, Any]) -> bool:
    """``evidence`` states a value other than ``value`` that ``fld`` could take: another member of its enum, an
    amount in another currency (a currency field), another token matching its ``pattern``."""
    leaf = fld.leaf
    members = leaf.get("enum") if isinstance(leaf.get("enum"), list) else []
    if any(m != value and not isinstance(m, (Mapping, list)) and m is not None
           and judge(m, fld, evidence, call).state == "stated" for m in members):
        return True
    if isinstance(value, str) and currency_field(fld) and any(value.upper() not in a.currencies
                                                               for a in evidence.amounts):
        return True
    pattern = leaf.get("pattern")
    if isinstance(value, str) and isinstance(pattern, str):
        try:
            shape = regex.compile(pattern, regex.IGNORECASE)
        except regex.error:
            return False
        own = normalize_text(value)
        return any(token != own and shape.fullmatch(token)
                   for token in (raw.strip(_TOKEN_EDGES) for raw in evidence.text.split()))
    return False


def _covered_values(parameters: Mapping[str, Any], arguments: Mapping[str, Any], *,
                    side_effects: bool) -> Iterator[tuple[str, Any, Field, Mapping[str, Any]]]:
    """``(path, value, field, the object holding it)`` of every covered value in ``arguments``."""
    for fld in covered_fields(parameters, side_effects=side_effects):
        for path, value, parent in _values_at(arguments, [p for p in fld.pattern.split("/") if p]):
            for item in value if isinstance(value, list) else [value]:
                if item is not None and not isinstance(item, (Mapping, list)):
                    yield path, item, fld, parent if isinstance(parent, Mapping) else {}


def check_grounding(parameters: Mapping[str, Any], arguments: Mapping[str, Any], evidence: ConversationValues, *,
                    side_effects: bool) -> list[Finding]:
    """Every grounded value of ``arguments`` the evidence does not state for its field, as findings.

    A finding is ``{path, value, message, validator: "grounded"}``; an empty list means every
    grounded value is stated, or unclear (left to a person: :func:`provenance`), or the tool grounds nothing.
    """
    findings = []
    for path, value, fld, parent in _covered_values(parameters, arguments, side_effects=side_effects):
        if not fld.grounded or _needs_no_evidence(value, fld, [evidence], parent):
            continue
        support = judge(value, fld, evidence, parent)
        if support.state == "absent":
            why = f"{support.reason}; " if support.reason else f"{value!r} is not stated in the conversation or an " \
                                                               f"earlier tool result ("
            tail = f"ask the user for {fld.name} instead of guessing" if support.reason else \
                f"{fld.name} must come from there; ask the user for it instead of guessing)"
            findings.append({"path": path, "value": value, "validator": "grounded", "message": why + tail})
    return findings


def provenance(parameters: Mapping[str, Any], arguments: Mapping[str, Any],
               sources: Sequence[tuple[Source, ConversationValues]], *, side_effects: bool) -> list[dict[str, Any]]:
    """Every covered value of ``arguments`` with the sources that state it for its field, as recorded on a call:
    ``{path, value, sources: [Source.public()...], trusted}`` and ``unclear`` (why) where the user's words leave
    it unclear. ``trusted``: a trusted source states it (the user, the platform, a tool whose results are
    trusted). A value no source states has ``sources: []``."""
    entries = []
    for path, value, fld, parent in _covered_values(parameters, arguments, side_effects=side_effects):
        trusted = [values for source, values in sources if source.trusted]
        found = [PLATFORM] if _needs_no_evidence(value, fld, trusted, parent) else []
        unclear = []
        for source, values in sources:
            support = judge(value, fld, values, parent)
            if support.state == "stated":
                found.append(source)
            elif support.state == "unclear" and source.trusted:
                unclear.append(support.reason)
        entry = {"path": path, "value": value, "sources": [source.public() for source in found],
                 "trusted": any(source.trusted for source in found)}
        if not entry["trusted"] and (unclear or not found):
            entry["unclear"] = unclear[0] if unclear else f"no one stated {value!r} for {fld.name}: the model wrote it"
        entries.append(entry)
    return entries


def untrusted(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The entries of :func:`provenance` that nothing trusted states: only untrusted tool results, or the user's
    words but unclearly (``unclear`` says why), or no one. They cannot authorize a side effect by themselves."""
    return [dict(entry) for entry in entries if not entry["trusted"]]
