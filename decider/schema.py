"""JSON Schemas for the constraint engine: tool-call schemas, feature checks, post-decoding checks.

Two documents come out of every schema that enters the decider:

- the **grammar schema**, what the constraint engine compiles (xgrammar here, TensorRT-LLM's
  xgrammar on Triton): ``x-*`` extensions stripped, ``x-aliases`` folded in as allowed values,
  ``allOf`` merged, ``$defs`` hoisted to the root so references still resolve once a tool's
  parameters are nested inside the tool-call array;
- the **validation schema**, the caller's schema untouched, checked with ``jsonschema`` after
  decoding (and after alias normalization).

Features the engine does not enforce are found up front. Those the grammar over-approximates
(it accepts a superset) are listed as :class:`Postcheck` entries and enforced by validation after
decoding; those it would get wrong in the other direction, or leave unconstrained, raise
:class:`~decider.errors.UnsupportedSchemaError` naming the feature and its JSON Pointer. Nothing
is ever silently unconstrained. The table below was probed against xgrammar 0.2.9
(``tests/decider/test_schema_features.py`` re-probes it against the installed version).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from decider.errors import UnsupportedSchemaError
from tools.schema_walk import SCHEMA_LISTS, SCHEMA_MAPS, SINGLE_SCHEMA, declared_types, map_subschemas, pointer
from tools.spec import ToolSpec
from tools.validator import validation_errors  # the validator (tools.validator), re-exported for decider callers

__all__ = [
    "DEFAULT_MAX_CALLS",
    "ENFORCED_FORMATS",
    "POSTCHECK_KEYWORDS",
    "Postcheck",
    "PreparedSchema",
    "REFUSED_KEYWORDS",
    "TEXT_ANSWER_SCHEMA",
    "bound_free_text",
    "canonical_json",
    "prepare_schema",
    "prepare_tool",
    "schema_hash",
    "tool_calls_schema",
    "validation_errors",
]

#: Upper bound on parallel calls in one decision when the caller sets none.
DEFAULT_MAX_CALLS = 4

#: Keywords the engine accepts but does not enforce (the grammar allows a superset): checked after decoding.
POSTCHECK_KEYWORDS: Mapping[str, str] = {
    "not": "ignored by the grammar",
    "if": "if/then/else ignored by the grammar",
    "dependentRequired": "ignored by the grammar",
    "dependentSchemas": "ignored by the grammar",
    "dependencies": "ignored by the grammar",
    "uniqueItems": "ignored by the grammar",
    "contains": "ignored by the grammar",
    "minContains": "ignored by the grammar",
    "maxContains": "ignored by the grammar",
    "oneOf": "decoded as anyOf; exactly-one checked after decoding",
}

#: Keywords the engine gets wrong (stricter than the schema, or unconstrained): refused.
REFUSED_KEYWORDS: Mapping[str, str] = {
    "patternProperties": "the grammar rejects every key matched by a pattern",
    "propertyNames": "the grammar rejects every key",
    "$dynamicRef": "dynamic references are not resolved by the grammar",
    "$recursiveRef": "recursive references are not resolved by the grammar",
}

#: ``format`` values the grammar enforces; any other format is checked after decoding.
ENFORCED_FORMATS = frozenset({
    "date", "date-time", "time", "duration", "email", "uuid", "uri", "uri-reference",
    "ipv4", "ipv6", "hostname", "json-pointer",
})

_REGEX_UNSUPPORTED = (
    (re.compile(r"\(\?[=!]|\(\?<[=!]"), "pattern lookaround"),
    (re.compile(r"\\[1-9]|\\k<"), "pattern backreference"),
)

#: A plain-text answer for ``tool_choice=auto``: the model may decline to call a tool.
TEXT_ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"content": {"type": "string", "maxLength": 400}},
    "required": ["content"],
    "additionalProperties": False,
}

_WALKED = frozenset((*SINGLE_SCHEMA, *SCHEMA_MAPS, *SCHEMA_LISTS))
#: Annotations the grammar has no use for.
_ANNOTATIONS = frozenset(("title", "examples", "$comment", "$schema", "$id", "deprecated", "readOnly", "writeOnly",
                          "nullable"))


def _grammar_drops(key: str, node: Mapping[str, Any]) -> bool:
    """Whether the grammar form of ``node`` leaves keyword ``key`` out (validation still enforces it)."""
    return (key.startswith("x-") or key in _ANNOTATIONS or key in ("then", "else", "contains")
            or key in POSTCHECK_KEYWORDS and key != "oneOf"  # ignored by the grammar; postchecked
            or key in ("minLength", "maxLength") and "format" in node)  # ignored next to a format; postchecked


@dataclass(frozen=True)
class Postcheck:
    """A constraint enforced by ``jsonschema`` after decoding rather than by the grammar."""

    feature: str
    path: str
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.feature} at {self.path or '/'}"


@dataclass(frozen=True)
class PreparedSchema:
    """A schema checked for the constraint engine: what to compile, what to validate, what is postchecked."""

    #: The caller's schema, used for validation after decoding.
    schema: dict[str, Any]
    #: The schema the constraint engine compiles.
    grammar_schema: dict[str, Any]
    postchecks: tuple[Postcheck, ...] = ()
    grammar_json: str = field(default="", repr=False)
    hash: str = ""

    def errors(self, instance: Any) -> list[str]:
        """Validation errors of ``instance`` against the caller's schema (empty when valid)."""
        return validation_errors(self.schema, instance)


def canonical_json(value: Any) -> str:
    """The wire text of a grammar schema: compact, UTF-8 kept, keys in their given order.

    Keys are not sorted: the grammar emits object properties in schema order, and
    ``name`` must come before ``arguments``.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def schema_hash(value: Any) -> str:
    """A short stable hash of a schema."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def prepare_schema(schema: Mapping[str, Any]) -> PreparedSchema:
    """Check ``schema`` for the constraint engine and build its grammar form.

    Raises :class:`UnsupportedSchemaError` (with ``feature`` and ``path``) for anything the
    grammar cannot represent without being looser in an unchecked way or stricter than the schema.
    """
    if not isinstance(schema, Mapping):
        raise UnsupportedSchemaError("schema", "", "a JSON Schema must be an object")
    original = copy.deepcopy(dict(schema))
    try:
        jsonschema.validators.validator_for(original, default=jsonschema.Draft202012Validator).check_schema(original)
    except jsonschema.SchemaError as exc:
        where = "/" + "/".join(str(p) for p in exc.absolute_path)
        raise UnsupportedSchemaError("invalid schema", where, f"invalid JSON Schema at {where}: {exc.message}") from None
    postchecks: list[Postcheck] = []
    grammar = _to_grammar(original, "", postchecks)
    grammar_json = canonical_json(grammar)
    return PreparedSchema(schema=original, grammar_schema=grammar, postchecks=tuple(dict.fromkeys(postchecks)),
                          grammar_json=grammar_json, hash=hashlib.sha256(grammar_json.encode()).hexdigest()[:16])


def _to_grammar(node: Any, path: str, postchecks: list[Postcheck]) -> Any:
    """The grammar form of one schema node (recursive); records postchecks, raises on refused features."""
    if isinstance(node, bool) or not isinstance(node, Mapping):
        return node
    for keyword, reason in REFUSED_KEYWORDS.items():
        if keyword in node:
            raise UnsupportedSchemaError(keyword, path, f"unsupported JSON Schema feature {keyword!r} at {path or '/'}: {reason}")
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        raise UnsupportedSchemaError("$ref", pointer(path, "$ref"),
                                     f"unsupported JSON Schema feature '$ref' at {path or '/'}: only local references (#/...) are resolved, got {ref!r}")
    for keyword, reason in POSTCHECK_KEYWORDS.items():
        if keyword in node and not (keyword == "oneOf" and len(node["oneOf"]) <= 1):
            postchecks.append(Postcheck(keyword, path, reason))
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        for regex, feature in _REGEX_UNSUPPORTED:
            if regex.search(pattern):
                raise UnsupportedSchemaError(feature, pointer(path, "pattern"),
                                             f"unsupported JSON Schema feature {feature!r} at {pointer(path, 'pattern')}: {pattern!r}")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in ENFORCED_FORMATS:
        postchecks.append(Postcheck(f"format:{fmt}", path, "format not enforced by the grammar"))
    if isinstance(fmt, str) and ("minLength" in node or "maxLength" in node):
        postchecks.append(Postcheck("minLength/maxLength with format", path, "the grammar enforces the format and ignores the length"))
    multiple = node.get("multipleOf")
    if multiple is not None and not (node.get("type") == "integer" and float(multiple).is_integer()):
        postchecks.append(Postcheck("multipleOf", path, "enforced by the grammar on integers only"))

    node = dict(node)
    if "allOf" in node:
        node = _merge_all_of(node, path)
    kept = {key: value if key in _WALKED else copy.deepcopy(value) for key, value in node.items()
            if not _grammar_drops(key, node)}
    out = map_subschemas(kept, lambda sub, where: _to_grammar(sub, where, postchecks), path)
    out = {("anyOf" if key == "oneOf" else "prefixItems" if key == "items" and isinstance(value, list) else key): value
           for key, value in out.items()}  # oneOf decoded as anyOf; draft-4 tuple ``items``
    if "anyOf" in out and len(out["anyOf"]) == 1 and set(out) == {"anyOf"}:
        out = out["anyOf"][0] if isinstance(out["anyOf"][0], dict) else out
    aliases = node.get("x-aliases")
    if isinstance(aliases, Mapping) and aliases:
        out = _allow_aliases(out, list(aliases))
    return out


def _allow_aliases(grammar: dict[str, Any], aliases: Sequence[str]) -> dict[str, Any]:
    """Let the grammar also produce the alias spellings of a field (normalized to canonical later)."""
    if "enum" in grammar and set(grammar) <= {"enum", "type", "description", "default"}:
        merged = dict(grammar)
        merged["enum"] = list(dict.fromkeys([*grammar["enum"], *aliases]))
        return merged
    if "const" in grammar and set(grammar) <= {"const", "type", "description", "default"}:
        return {**{k: v for k, v in grammar.items() if k != "const"}, "enum": list(dict.fromkeys([grammar["const"], *aliases]))}
    restricting = {"enum", "const", "pattern", "format", "minLength", "maxLength", "anyOf", "$ref", "type"}
    if grammar.get("type") == "string" and not (set(grammar) & (restricting - {"type"})):
        return grammar  # a free string already admits every alias
    if not set(grammar) & restricting:
        return grammar
    return {"anyOf": [grammar, {"enum": list(aliases)}]}


def _merge_all_of(node: dict[str, Any], path: str) -> dict[str, Any]:
    """Merge ``allOf`` branches into one schema (the grammar mishandles multi-branch ``allOf``)."""
    branches = node.pop("allOf")
    merged = dict(node)
    for index, branch in enumerate(branches):
        if branch is True:
            continue
        if not isinstance(branch, Mapping) or "$ref" in branch or "allOf" in branch and len(branch["allOf"]) > 1:
            raise UnsupportedSchemaError("allOf", pointer(path, "allOf", index),
                                         f"unsupported JSON Schema feature 'allOf' at {pointer(path, 'allOf', index)}: "
                                         "only branches of plain keywords can be merged for the grammar")
        for key, value in branch.items():
            if key not in merged or merged[key] == value:
                merged[key] = copy.deepcopy(value)
            elif key == "required":
                merged[key] = list(dict.fromkeys([*merged[key], *value]))
            elif key == "properties":
                props = dict(merged[key])
                for name, sub in value.items():
                    if name in props and props[name] != sub:
                        raise UnsupportedSchemaError("allOf", pointer(path, "allOf", index, "properties", name),
                                                     f"unsupported JSON Schema feature 'allOf' at {path or '/'}: "
                                                     f"branches constrain property {name!r} differently")
                    props[name] = sub
                merged[key] = props
            elif key == "additionalProperties":
                merged[key] = False if False in (merged[key], value) else merged[key]
            elif key in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"):
                merged[key] = max(merged[key], value)
            elif key in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"):
                merged[key] = min(merged[key], value)
            elif key in ("description", "title"):
                continue
            else:
                raise UnsupportedSchemaError("allOf", pointer(path, "allOf", index, key),
                                             f"unsupported JSON Schema feature 'allOf' at {path or '/'}: "
                                             f"branches disagree on {key!r}")
    return merged


def _hoist_defs(grammar: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Move ``$defs``/``definitions`` of a nested schema to the root under ``prefix``, rewriting refs."""
    grammar = copy.deepcopy(grammar)
    local = {**grammar.pop("definitions", {}), **grammar.pop("$defs", {})}

    def rewrite(node: Any, where: str) -> Any:
        if not isinstance(node, Mapping):
            return node
        node = map_subschemas(node, rewrite, where)
        ref = node.get("$ref")
        if ref == "#":
            raise UnsupportedSchemaError("$ref", where, "a tool's parameters cannot refer to their own root ('#')")
        match = re.match(r"^#/(?:\$defs|definitions)/(.+)$", ref) if isinstance(ref, str) else None
        if match:
            node["$ref"] = f"#/$defs/{prefix}{match.group(1)}"
        return node

    for name, sub in local.items():
        defs[f"{prefix}{name}"] = rewrite(sub, pointer("/$defs", name))
    return rewrite(grammar, "")


def _call_branch(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_calls_schema(
    tools: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    min_calls: int = 1,
    max_calls: int | None = DEFAULT_MAX_CALLS,
    allow_text: bool = False,
    text_max_chars: int | None = None,
    positions: Sequence[Sequence[tuple[str, Mapping[str, Any]]]] | None = None,
) -> dict[str, Any]:
    """The grammar schema of "the assistant's tool calls".

    ``tools`` yields ``(name, grammar parameters)`` pairs (already prepared, possibly narrowed).
    The result is an array of ``{"name": <const>, "arguments": <parameters>}`` objects, one
    ``anyOf`` branch per tool, ``min_calls..max_calls`` long; with ``allow_text`` it may
    instead be ``{"content": "..."}`` (the model answers without calling a tool), at most
    ``text_max_chars`` long when given. ``positions`` narrows call ``i`` to its own
    ``(name, parameters)`` branches (``prefixItems``): one call per evidence set, in order;
    the array is then at most ``len(positions)`` long.
    """
    defs: dict[str, Any] = {}
    branches = []
    for position, (name, parameters) in enumerate(tools):
        arguments = _hoist_defs(dict(parameters), f"t{position}_", defs)
        branches.append(_call_branch(name, arguments))
    options: list[dict[str, Any]] = []
    if branches:
        calls: dict[str, Any] = {"type": "array", "items": branches[0] if len(branches) == 1 else {"anyOf": branches},
                                 "minItems": max(1, min_calls)}
        if max_calls is not None:
            calls["maxItems"] = max(calls["minItems"], max_calls)
        if positions:
            prefix = []
            for index, position in enumerate(positions):
                own = [_call_branch(name, _hoist_defs(dict(parameters), f"p{index}t{j}_", defs))
                       for j, (name, parameters) in enumerate(position)]
                prefix.append(own[0] if len(own) == 1 else {"anyOf": own})
            prefix = prefix[:calls.get("maxItems", len(prefix))]  # a fixed smaller count keeps the first groups
            calls = {"type": "array", "prefixItems": prefix, "items": False,
                     "minItems": min(calls["minItems"], len(prefix)),
                     "maxItems": min(calls.get("maxItems", len(prefix)), len(prefix))}
        options.append(calls)
    if allow_text or not branches:
        text = copy.deepcopy(TEXT_ANSWER_SCHEMA)
        if text_max_chars is not None:  # a short answer ends fast when no tool applies
            text["properties"]["content"]["maxLength"] = max(1, text_max_chars)
        options.append(text)
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


_TIME_SHAPE = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#: ``format`` → the same shape as a bounded pattern (grammar only; validation keeps the format).
_BOUNDED_FORMATS = {
    "date-time": r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T" + _TIME_SHAPE + "$",
    "time": "^" + _TIME_SHAPE + "$",
}


def bound_free_text(grammar: Any, *, string_max: int | None, array_max: int | None,
                    path: str = "") -> tuple[Any, list[str]]:
    """The grammar with a platform bound on every free string and array the schema leaves unbounded.

    A string with no ``maxLength``, ``enum``, ``const``, ``pattern`` or ``format`` gets
    ``maxLength: string_max``; an array with no ``maxItems`` gets ``maxItems: array_max``; a
    ``date-time``/``time`` format becomes the same shape with at most 6 fractional digits (the
    format's own grammar lets a small model write zeros forever). The
    bounds live in the grammar only (validation keeps the caller's schema): decoding can no longer
    run to the token limit inside one value. Returns the grammar and the JSON Pointers bounded.
    """
    bounded: list[str] = []

    def visit(node: Any, where: str) -> Any:
        if not isinstance(node, Mapping):
            return node
        out = map_subschemas(node, visit, where)
        kinds = declared_types(out)
        if string_max and "string" in kinds and not ({"maxLength", "enum", "const", "pattern", "format"} & set(out)):
            out["maxLength"] = string_max
            bounded.append(f"{where or '/'}: maxLength {string_max}")
        if string_max and out.get("format") in _BOUNDED_FORMATS and not ({"pattern", "enum", "const"} & set(out)):
            out["pattern"] = _BOUNDED_FORMATS[out.pop("format")]
            bounded.append(f"{where or '/'}: format as a pattern with at most 6 fractional digits")
        if array_max and "array" in kinds and "maxItems" not in out:
            out["maxItems"] = max(array_max, out.get("minItems", 0))
            bounded.append(f"{where or '/'}: maxItems {out['maxItems']}")
        return out

    return visit(grammar, path), bounded


def prepare_tool(spec: ToolSpec) -> PreparedSchema:
    """Prepare a tool's parameter schema (feature check + grammar form)."""
    try:
        return prepare_schema(spec.parameters)
    except UnsupportedSchemaError as exc:
        path = f"/tools/{spec.name}/parameters{exc.path}"
        raise UnsupportedSchemaError(exc.feature, path, f"tool {spec.name!r}: {exc}") from None

