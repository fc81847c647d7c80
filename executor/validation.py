"""JSON Schema validation (Draft 2020-12) with errors as plain, model-readable records."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import json

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

__all__ = ["validate", "validator_for"]

MAX_ERRORS = 8


@lru_cache(maxsize=512)
def _cached_validator(schema_json: str) -> Draft202012Validator:
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator for ``schema``, built once per distinct schema."""
    return _cached_validator(json.dumps(schema, sort_keys=True, ensure_ascii=False))


def validate(value: Any, schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every validation error of ``value`` as ``{path, message, validator}``, most relevant first."""
    validator = validator_for(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: (list(e.absolute_path), e.validator))
    if not errors:
        return []
    first = best_match(errors)
    ordered = [first, *[e for e in errors if e is not first]]
    out = []
    for error in ordered[:MAX_ERRORS]:
        path = "/" + "/".join(str(p) for p in error.absolute_path)
        message = error.message
        if error.validator == "additionalProperties":
            message = f"{message} (fields outside the schema are not accepted)"
        out.append({"path": path, "message": message, "validator": error.validator})
    return out
