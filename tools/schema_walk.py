"""The one walk over JSON Schemas: which values of a schema are schemas, and which are data.

Every stage that reads a schema (strict mode, grammar preparation, bounding, typed candidates,
grounding, cleaning, pattern and ``$ref`` checks) walks it through this module, so each reads
the same document the same way:

- the names inside ``properties``, ``patternProperties``, ``$defs``, ``definitions``,
  ``dependentSchemas`` and ``dependencies`` are *data* (a parameter may be called ``type``,
  ``format``, ``properties`` or ``$ref``); only their values are subschemas;
- ``items`` (a schema, or the draft 4-7 list), ``prefixItems``, ``additionalProperties``,
  ``unevaluatedProperties``, ``additionalItems``, ``unevaluatedItems``, ``contains``,
  ``propertyNames``, ``not``, ``if``/``then``/``else`` and ``anyOf``/``oneOf``/``allOf`` hold
  subschemas; a boolean there (``additionalProperties: false``) is a schema with no keywords;
- every other keyword's value (``enum``, ``const``, ``default``, ``examples``, ``required``,
  ``x-*`` extensions) is data and is never walked.

:func:`subschemas` lists every schema object with its JSON Pointer; :func:`map_subschemas`
rebuilds one node with each direct subschema replaced (for stages that rewrite);
:func:`children` names the keyword each direct subschema sits under (:data:`PARTIAL` ones are
parts or conditions, not shapes); :func:`declared_types` reads a node's ``type``;
:func:`map_described` rebuilds an instance part by part, each with the schema node that describes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "PARTIAL",
    "SCHEMA_LISTS",
    "SCHEMA_MAPS",
    "SINGLE_SCHEMA",
    "children",
    "declared_types",
    "map_described",
    "map_subschemas",
    "pointer",
    "subschemas",
]

#: Keywords whose value is one subschema (``items`` may also be a draft 4-7 list).
SINGLE_SCHEMA = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "unevaluatedItems",
                 "contains", "propertyNames", "not", "if", "then", "else")
#: Keywords whose value maps names (data) to subschemas; ``dependencies`` values may be name lists.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
#: Keywords whose value is a list of subschemas.
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
#: Keywords whose subschemas are not a whole shape of a value (as ``anyOf``/``oneOf`` branches are): parts or
#: conditions of the parent's own shape, or tests of some of its items (``contains``) or names (``propertyNames``).
PARTIAL = ("allOf", "if", "then", "else", "not", "dependentSchemas", "dependencies", "contains", "propertyNames")

_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null",
               list: "array", dict: "object"}


def pointer(path: str, *parts: Any) -> str:
    """``path`` extended by ``parts`` as JSON Pointer tokens (``~`` and ``/`` escaped)."""
    for part in parts:
        path += "/" + str(part).replace("~", "~0").replace("/", "~1")
    return path


def _slots(node: Mapping[str, Any]) -> Iterator[tuple[str, str | int | None, Any]]:
    """``(keyword, name or index or None, subschema)`` for each direct subschema of ``node``, in key order."""
    for key, value in node.items():
        if key in SINGLE_SCHEMA:
            if isinstance(value, list) and key == "items":
                yield from ((key, index, sub) for index, sub in enumerate(value))
            else:
                yield key, None, value
        elif key in SCHEMA_MAPS and isinstance(value, Mapping):
            yield from ((key, name, sub) for name, sub in value.items() if isinstance(sub, (Mapping, bool)))
        elif key in SCHEMA_LISTS and isinstance(value, list):
            yield from ((key, index, sub) for index, sub in enumerate(value))


def children(node: Any, path: str = "") -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """``(keyword, JSON Pointer, subschema)`` for each direct subschema object of ``node`` (booleans skipped)."""
    if not isinstance(node, Mapping):
        return
    for key, slot, sub in _slots(node):
        if isinstance(sub, Mapping):
            yield key, (pointer(path, key) if slot is None else pointer(path, key, slot)), sub


def subschemas(schema: Any, path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema object inside ``schema`` (itself first, then depth-first) with its JSON Pointer.

    A node is yielded before its children are read: a caller may change it in place (strict mode).
    """
    stack: list[tuple[str, Any]] = [(path, schema)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, Mapping):
            continue
        yield where, node
        stack.extend(reversed([(child_path, child) for _, child_path, child in children(node, where)]))


def map_subschemas(node: Mapping[str, Any], fn: Callable[[Any, str], Any], path: str = "") -> dict[str, Any]:
    """A shallow copy of ``node`` with each direct subschema ``sub`` replaced by ``fn(sub, its pointer)``.

    Boolean subschemas are passed to ``fn`` too; data keywords are copied by reference.
    """
    out = dict(node)
    for key, slot, sub in _slots(node):
        where = pointer(path, key) if slot is None else pointer(path, key, slot)
        if slot is None:
            out[key] = fn(sub, where)
        else:
            if out[key] is node[key]:
                out[key] = dict(node[key]) if isinstance(node[key], Mapping) else list(node[key])
            out[key][slot] = fn(sub, where)
    return out


def declared_types(node: Any, *, inferred: bool = False) -> set[str]:
    """The type names ``node`` declares in ``type`` (a string or a list of them).

    With ``inferred``, a node without ``type`` admits the union of its ``anyOf``/``oneOf``
    branches' types, else the JSON types of its ``enum``/``const`` values. Empty when unknown.
    """
    if not isinstance(node, Mapping):
        return set()
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    if not inferred:
        return set()
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            return set().union(*(declared_types(branch, inferred=True) for branch in node[key]))
    values = node["enum"] if isinstance(node.get("enum"), list) else [node["const"]] if "const" in node else []
    return {_JSON_TYPES.get(type(value), "unknown") for value in values}


def map_described(value: Any, schema: Any, fn: Callable[[Any, Mapping[str, Any], str], Any], path: str = "") -> Any:
    """``value`` rebuilt with ``fn(part, its schema, instance pointer)`` applied to it and to each part
    ``properties``/``items`` describe, parents first (a part is read from its rewritten parent).

    Only the containers the schema describes are copied; ``value`` itself is never changed, and parts the
    schema does not describe are kept as they are (never walked, however deep).
    """
    if not isinstance(schema, Mapping):
        return value
    value = fn(value, schema, path)
    props, items = schema.get("properties"), schema.get("items")
    if isinstance(value, dict) and isinstance(props, Mapping):
        return {key: map_described(part, props[key], fn, pointer(path, key)) if key in props else part
                for key, part in value.items()}
    if isinstance(value, list) and isinstance(items, Mapping):
        return [map_described(part, items, fn, pointer(path, index)) for index, part in enumerate(value)]
    return value
