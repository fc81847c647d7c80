"""What the quality bench reads from a tool's JSON Schema: :func:`canonical_arguments` (defaults filled,
aliases applied, numbers and instants unified), :func:`validation_errors` (formats included) and
:func:`admitted_outcomes` (how many values a compiled constraint admits)."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema

from tools.spec import ToolSpec

__all__ = ["admitted_outcomes", "canonical_arguments", "validation_errors"]


def _canonical_string(text: str, schema: Mapping[str, Any]) -> str:
    text = unicodedata.normalize("NFKC", text).strip()
    aliases = schema.get("x-aliases")
    if isinstance(aliases, Mapping) and aliases:
        if text in aliases:
            return aliases[text]
        folded = text.casefold()
        for alias, canonical in aliases.items():
            if folded in (alias.casefold(), canonical.casefold()):
                return canonical
    if schema.get("format") == "date-time":
        # One instant, one spelling: 10:00:00Z == 10:00:00+00:00 == 18:00+08:00. A value without
        # an offset stays distinct from every value with one.
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            return text
        return (moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment).isoformat()
    return text


def _resolve(schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with a local ``$ref`` followed (one level is all pydantic writes); {} for anything else."""
    seen = 0
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and seen < 16:
        target: Any = root
        for part in schema["$ref"].removeprefix("#").strip("/").split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, Mapping) else {}
        schema, seen = target, seen + 1
    return schema if isinstance(schema, Mapping) else {}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _branch_for(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``anyOf``/``oneOf`` branch whose type fits ``value`` (a nullable field's non-null branch)."""
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            branch = _resolve(branch, root)
            types = branch.get("type")
            types = [types] if isinstance(types, str) else list(types or ())
            kind = _json_type(value)
            if not types or kind in types or (kind == "number" and "integer" in types):
                return {**{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}, **branch}
    return schema


def _canonical_value(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    schema = _branch_for(value, _resolve(schema, root), root)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number) and number == int(number):
            return int(number)
        return round(number, 9)
    if isinstance(value, str):
        return _canonical_string(value, schema)
    if isinstance(value, list):
        items = schema.get("items")
        return [_canonical_value(item, items if isinstance(items, Mapping) else {}, root) for item in value]
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        filled = dict(value)
        for name, prop in properties.items():
            prop = _resolve(prop, root)
            if name not in filled and "default" in prop:
                filled[name] = prop["default"]
        return {key: _canonical_value(item, properties.get(key, {}), root) for key, item in filled.items()}
    return value


def canonical_arguments(spec: ToolSpec | None, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Arguments as the executor would see them after cleaning: defaults filled, aliases resolved, numbers unified.

    Driven by the spec's schema at every level (nested objects get their defaults too);
    ``date-time`` values become one spelling of their instant.
    """
    schema = spec.parameters if spec is not None else {}
    return _canonical_value(dict(arguments or {}), schema, schema)


_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$")
#: Formats are part of validity, as in the grammar: ``date-time`` is RFC 3339 with an offset
#: (jsonschema checks it only when the optional rfc3339-validator is installed, so it is here).
_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("date-time", raises=ValueError)
def _is_rfc3339(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    dt.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))  # a real date and time, or ValueError
    return True


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=_FORMATS)


def validation_errors(spec: ToolSpec, arguments: Any) -> list[str]:
    """Messages of every JSON Schema error of ``arguments`` against ``spec``, formats included (empty when valid)."""
    if not isinstance(arguments, dict):
        return ["arguments are not a JSON object"]
    validator = _validator(json.dumps(spec.parameters, sort_keys=True))
    return [error.message for error in validator.iter_errors(arguments)]


_INF = float("inf")


def _times(a: int | float, b: int | float) -> int | float:
    return 0 if a == 0 or b == 0 else a * b


def admitted_outcomes(schema: Any, *, strict: bool = True) -> int | float:
    """How many distinct JSON values ``schema`` admits: an int, or ``float("inf")``.

    ``const`` admits one value, ``enum`` its members, ``boolean`` two, ``null`` one, an integer
    with both bounds its range; free strings (also under ``pattern``/``format``), unbounded
    numbers and arrays of more than zero item choices with no ``maxItems`` are infinite.
    ``anyOf``/``oneOf`` add up their branches, arrays sum ``items ** length`` (or the product of
    their ``prefixItems``) over the lengths allowed, objects multiply their properties (an
    optional one also admits being absent). Local ``$ref`` are followed; a reference cycle is
    infinite. With ``strict`` (the grammar's reading, as xgrammar compiles it) an object without
    ``additionalProperties`` admits no other keys; otherwise such an object is infinite. Branches
    that overlap are counted twice, so the count is an upper bound where they do; it is exact for
    the disjoint constraints tool-call grammars are built from.
    """
    root = schema if isinstance(schema, Mapping) else {}
    return _count(schema, root, strict, ())


def _count(schema: Any, root: Mapping[str, Any], strict: bool, refs: tuple[str, ...]) -> int | float:
    if schema is True:
        return _INF
    if schema is False:
        return 0
    if not isinstance(schema, Mapping):
        return _INF
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref in refs:
            return _INF
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        target = _resolve({"$ref": ref}, root)
        merged = {**target, **rest} if rest else target
        return _count(merged, root, strict, (*refs, ref))
    if "const" in schema:
        return 1
    if isinstance(schema.get("enum"), list):
        return len({json.dumps(v, sort_keys=True) for v in schema["enum"]})
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            base = {k: v for k, v in schema.items() if k != key}
            return sum((_count({**base, **b} if isinstance(b, Mapping) else b, root, strict, refs)
                        for b in schema[key]), start=0)
    if isinstance(schema.get("allOf"), list):
        base = {k: v for k, v in schema.items() if k != "allOf"}
        return min((_count({**base, **b} if isinstance(b, Mapping) else b, root, strict, refs)
                    for b in schema["allOf"]), default=_count(base, root, strict, refs))
    types = schema.get("type")
    if isinstance(types, list):
        return sum((_count({**schema, "type": t}, root, strict, refs) for t in types), start=0)
    if types is None:
        for implied, keys in (("object", ("properties", "required", "additionalProperties")),
                              ("array", ("items", "prefixItems", "minItems", "maxItems")),
                              ("string", ("pattern", "format", "minLength", "maxLength"))):
            if any(k in schema for k in keys):
                return _count({**schema, "type": implied}, root, strict, refs)
        return _INF
    if types == "null":
        return 1
    if types == "boolean":
        return 2
    if types == "string":
        return 1 if schema.get("maxLength") == 0 else _INF
    if types in ("integer", "number"):
        return _count_numbers(schema, integer=types == "integer")
    if types == "array":
        return _count_array(schema, root, strict, refs)
    if types == "object":
        return _count_object(schema, root, strict, refs)
    return _INF


def _count_numbers(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    low_open, high_open = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if integer:
        first = [math.ceil(low)] if isinstance(low, (int, float)) else []
        last = [math.floor(high)] if isinstance(high, (int, float)) else []
        if isinstance(low_open, (int, float)) and not isinstance(low_open, bool):
            first.append(math.floor(low_open) + 1)
        if isinstance(high_open, (int, float)) and not isinstance(high_open, bool):
            last.append(math.ceil(high_open) - 1)
        if not first or not last:
            return _INF
        return max(0, min(last) - max(first) + 1)
    if low is not None and high is not None and low == high and low_open is None and high_open is None:
        return 1
    lows = [v for v in (low, low_open) if isinstance(v, (int, float))]
    highs = [v for v in (high, high_open) if isinstance(v, (int, float))]
    if lows and highs and max(lows) > min(highs):
        return 0
    return _INF


def _count_array(schema: Mapping[str, Any], root: Mapping[str, Any], strict: bool, refs: tuple[str, ...]) -> int | float:
    low = int(schema.get("minItems", 0))
    high = schema.get("maxItems")
    prefix = [_count(p, root, strict, refs) for p in schema.get("prefixItems") or ()]
    rest = _count(schema.get("items", True), root, strict, refs)
    # The longest array that can exist at all: up to the first position nothing fits.
    longest = next((i for i, ways in enumerate(prefix) if ways == 0), len(prefix) if rest == 0 else None)
    if longest is not None:
        high = longest if high is None else min(int(high), longest)
    if high is None:
        return _INF
    total: int | float = 0
    for length in range(low, int(high) + 1):
        ways: int | float = 1
        for position in range(length):
            ways = _times(ways, prefix[position] if position < len(prefix) else rest)
        total += ways
    return total


def _count_object(schema: Mapping[str, Any], root: Mapping[str, Any], strict: bool, refs: tuple[str, ...]) -> int | float:
    extra = schema.get("additionalProperties", not strict)
    if extra is not False and _count(extra, root, strict, refs) != 0:
        return _INF
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    if required - set(properties):
        return 0
    total: int | float = 1
    for name, prop in properties.items():
        own = _count(prop, root, strict, refs)
        total = _times(total, own if name in required else own + 1)
    return total

