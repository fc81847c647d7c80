"""JSON Schema validation (Draft 2020-12) with errors as plain, model-readable records.

The validator is :func:`tools.patterns.validator_for`: client patterns and formats never meet a
backtracking engine.
"""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import best_match

from tools.patterns import match_budget, validator_for  # patterns and formats on RE2: linear in the text

__all__ = ["validate", "validator_for"]

MAX_ERRORS = 8


def validate(value: Any, schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every validation error of ``value`` as ``{path, message, validator}``, most relevant first."""
    validator = validator_for(schema)
    with match_budget():  # every pattern check of this value shares one budget
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
