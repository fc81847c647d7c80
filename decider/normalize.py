"""Semantic normalization of decoded arguments, before validation.

The grammar lets the model copy what the user wrote (沪, 上海) when a field declares
``x-aliases``; these steps map such values to the canonical one (Shanghai) so the tool and the
validator only ever see canonical values. Each step is a small pure function
``(value, schema) -> value``; :data:`NORMALIZERS` runs them in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["NORMALIZERS", "Normalizer", "apply_aliases", "fold_enum_case", "normalize_arguments"]

Normalizer = Callable[[Any, Mapping[str, Any]], Any]


def _walk(value: Any, schema: Mapping[str, Any], leaf: Normalizer) -> Any:
    """Apply ``leaf`` to every value whose schema node is known, descending objects and arrays."""
    if not isinstance(schema, Mapping):
        return value
    value = leaf(value, schema)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        return {key: _walk(item, props[key], leaf) if key in props else item for key, item in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_walk(item, schema["items"], leaf) for item in value]
    return value


def _alias_leaf(value: Any, schema: Mapping[str, Any]) -> Any:
    aliases = schema.get("x-aliases")
    if isinstance(aliases, Mapping) and isinstance(value, str) and value in aliases:
        return aliases[value]
    return value


def _enum_case_leaf(value: Any, schema: Mapping[str, Any]) -> Any:
    enum = schema.get("enum")
    if isinstance(value, str) and isinstance(enum, list) and value not in enum:
        folded = {item.casefold(): item for item in enum if isinstance(item, str)}
        return folded.get(value.strip().casefold(), value)
    return value


def apply_aliases(value: Any, schema: Mapping[str, Any]) -> Any:
    """Replace alias spellings (``x-aliases``) by their canonical value, at any depth."""
    return _walk(value, schema, _alias_leaf)


def fold_enum_case(value: Any, schema: Mapping[str, Any]) -> Any:
    """Map a case/whitespace variant of an enum value (" Celsius") to the enum's spelling."""
    return _walk(value, schema, _enum_case_leaf)


NORMALIZERS: tuple[Normalizer, ...] = (apply_aliases, fold_enum_case)


def normalize_arguments(arguments: Any, schema: Mapping[str, Any], *,
                        steps: tuple[Normalizer, ...] = NORMALIZERS) -> Any:
    """Run the normalization steps over decoded arguments; returns a new value, never mutates."""
    for step in steps:
        arguments = step(arguments, schema)
    return arguments
