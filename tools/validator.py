"""The JSON Schema validator: Draft 2020-12, with nothing backtracking over client data.

:func:`validator_for` builds a validator once per distinct schema (every ``pattern`` compiled
first by :func:`tools.patterns.check_schema_patterns`, the schema itself checked); its ``pattern``,
``patternProperties``, ``additionalProperties`` and ``unevaluatedProperties`` keywords match on
RE2 (:mod:`tools.patterns`) and its ``format`` checks are fixed RE2 shapes over at most
:data:`MAX_FORMAT_LENGTH` characters. Two renderings of one check:

- :func:`validate` — records ``{path, message, validator}``, most relevant first (re-ask feedback,
  call errors);
- :func:`validation_errors` — every error as a ``path: message`` line.

The pattern checks of one call share one :func:`tools.patterns.match_budget`.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import uuid
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema._utils import extras_msg  # the message jsonschema itself writes for extra properties
from jsonschema.exceptions import best_match

from tools.errors import PatternBudgetError, UnsupportedPatternError
from tools.patterns import check_schema_patterns, compile_pattern, match_budget

__all__ = [
    "MAX_ERRORS",
    "MAX_FORMAT_LENGTH",
    "SAFE_FORMAT_CHECKER",
    "SafeValidator",
    "validate",
    "validation_errors",
    "validator_for",
]

#: Records :func:`validate` returns at most.
MAX_ERRORS = 8


# ----------------------------------------------------------------- formats

def _shape(pattern: str) -> Any:
    """A fixed, small pattern of ours on RE2; its inputs are capped at :data:`MAX_FORMAT_LENGTH`."""
    options = re2.Options()
    options.log_errors = False
    regex = re2.compile(pattern, options)
    return lambda text: regex.search(text) is not None


# Fixed shapes, run on RE2 too: no format check backtracks over client text.
_DATE = _shape(r"^\d{4}-\d{2}-\d{2}$")
_TIME = _shape(r"^([01]\d|2[0-3]):[0-5]\d(:([0-5]\d|60)(\.\d+)?)?([zZ]|[+-]([01]\d|2[0-3]):[0-5]\d)?$")
_DURATION = _shape(r"^P(?:\d+W|(?:\d+Y)?(?:\d+M)?(?:\d+D)?(?:T(?:\d+H)?(?:\d+M)?(?:\d+(?:\.\d+)?S)?)?)$")
_HOST_LABEL = _shape(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_EMAIL_LOCAL = _shape(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+$")
_URI_SCHEME = _shape(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_URI_CHARS = _shape(r"^(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*$")
_JSON_POINTER = _shape(r"^(?:/(?:[^~/]|~[01])*)*$")
_UUID = _shape(r"^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$")
#: Longest string a format check reads; longer strings fail the format without being scanned.
MAX_FORMAT_LENGTH = 2_048

SAFE_FORMAT_CHECKER = FormatChecker(formats=())


def _format(name: str, *, raises: type[Exception] | tuple[type[Exception], ...] = ()) -> Any:
    def register(check: Any) -> Any:
        def bounded(instance: object) -> bool:
            if not isinstance(instance, str):
                return True
            return len(instance) <= MAX_FORMAT_LENGTH and check(instance)

        return SAFE_FORMAT_CHECKER.checks(name, raises=raises)(bounded)

    return register


@_format("date", raises=ValueError)
def _is_date(value: str) -> bool:
    return _DATE(value) and bool(_dt.date.fromisoformat(value))


@_format("time")
def _is_time(value: str) -> bool:
    # RFC 3339 full-time, with the seconds and the offset optional: the decider reads "15:00" as a time.
    return _TIME(value)


@_format("date-time", raises=ValueError)
def _is_date_time(value: str) -> bool:
    date, sep, time = value[:10], value[10:11], value[11:]
    return sep in ("T", "t", " ") and _is_date(date) and _TIME(time)


@_format("duration")
def _is_duration(value: str) -> bool:
    return value not in ("P", "PT") and not value.endswith("T") and _DURATION(value)


@_format("email")
@_format("idn-email")
def _is_email(value: str) -> bool:
    local, at, domain = value.rpartition("@")
    return bool(at and local and domain) and (_EMAIL_LOCAL(local) or not local.isascii()) and " " not in value


@_format("hostname")
def _is_hostname(value: str) -> bool:
    labels = value[:-1].split(".") if value.endswith(".") else value.split(".")
    return 0 < len(value) <= 253 and all(_HOST_LABEL(label) for label in labels)


@_format("ipv4")
def _is_ipv4(value: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(value), ipaddress.IPv4Address) and value.count(".") == 3
    except ValueError:
        return False


@_format("ipv6")
def _is_ipv6(value: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(value), ipaddress.IPv6Address)
    except ValueError:
        return False


@_format("uri")
def _is_uri(value: str) -> bool:
    return _URI_SCHEME(value) and _URI_CHARS(value)


@_format("uri-reference")
def _is_uri_reference(value: str) -> bool:
    return _URI_CHARS(value)


@_format("uuid")
def _is_uuid(value: str) -> bool:
    return _UUID(value) and bool(uuid.UUID(value))


@_format("json-pointer")
def _is_json_pointer(value: str) -> bool:
    return _JSON_POINTER(value)


@_format("regex")
def _is_regex(value: str) -> bool:
    try:
        compile_pattern(value)
    except UnsupportedPatternError:
        return False
    return True


# ----------------------------------------------------------------- keywords on RE2


def _short(value: str, limit: int = 200) -> str:
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value)} characters)"


def _pattern(validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = compile_pattern(pattern, path="/pattern").search(instance)
    except PatternBudgetError as exc:
        yield ValidationError(str(exc))
        return
    if not matched:
        yield ValidationError(f"{_short(instance)} does not match {pattern!r}")


def _matches_any(patterns: Any, name: str) -> bool:
    """Whether a property name matches one of the patterns; a name too long to check matches none."""
    for pattern in patterns:
        try:
            if compile_pattern(pattern, path="/patternProperties").search(name):
                return True
        except PatternBudgetError:
            continue
    return False


def _pattern_properties(validator: Any, pattern_properties: Mapping[str, Any], instance: Any,
                        schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _matches_any((pattern,), key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any,
                           schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    # jsonschema's own version matches patternProperties with ``re``; this one with RE2, same messages.
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = {key for key in instance if key not in properties and not _matches_any(patterns, key)}
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            listed, verb = extras_msg(sorted(extras, key=str))
            yield ValidationError(f"Additional properties are not allowed ({listed} {verb} unexpected)")


def _is_valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator: Any, instance: Mapping[str, Any], schema: Any) -> set[str]:
    """The keys of ``instance`` some keyword of ``schema`` evaluates (jsonschema's rule, patterns on RE2)."""
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    for ref_keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(ref_keyword)
        if ref is not None:
            resolved = validator._resolver.lookup(ref)  # the resolver jsonschema's own rule uses
            keys |= _evaluated_keys(validator.evolve(schema=resolved.contents, _resolver=resolved.resolver),
                                    instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys |= {key for key, value in instance.items() if _is_valid(validator.descend(value, subschema))}
    if "patternProperties" in schema:
        keys |= {key for key in instance if _matches_any(schema["patternProperties"], key)}
    for name, subschema in (schema.get("dependentSchemas") or {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if _is_valid(validator.descend(instance, subschema)):
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator: Any, unevaluated: Any, instance: Any,
                            schema: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    failing = [key for key in instance if key not in evaluated
               and not _is_valid(validator.descend(instance[key], unevaluated, path=key, schema_path=key))]
    if failing:
        if unevaluated is False:
            listed, verb = extras_msg(sorted(failing, key=str))
            yield ValidationError(f"Unevaluated properties are not allowed ({listed} {verb} unexpected)")
        else:
            listed, verb = extras_msg(failing)
            yield ValidationError(f"Unevaluated properties are not valid under the given schema ({listed} {verb} "
                                  "unevaluated and invalid)")


SafeValidator = validators.extend(
    Draft202012Validator,
    validators={"pattern": _pattern, "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties, "unevaluatedProperties": _unevaluated_properties},
    format_checker=SAFE_FORMAT_CHECKER,
)


# ----------------------------------------------------------------- entry points


def _canonical(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=512)
def _cached_validator(canonical: str) -> Any:
    schema = json.loads(canonical)
    check_schema_patterns(schema)
    SafeValidator.check_schema(schema, format_checker=SAFE_FORMAT_CHECKER)
    return SafeValidator(schema, format_checker=SAFE_FORMAT_CHECKER)


def validator_for(schema: Mapping[str, Any]) -> Any:
    """A Draft 2020-12 validator for ``schema`` whose patterns and formats run in linear time.

    Built once per distinct schema (canonical JSON). Raises :class:`~tools.errors.UnsupportedPatternError`
    for a pattern RE2 cannot run and ``jsonschema.SchemaError`` for an invalid schema.
    """
    return _cached_validator(_canonical(schema))


def validation_errors(schema: Mapping[str, Any], instance: Any) -> list[str]:
    """Every error of ``instance`` against ``schema`` (formats checked), as ``path: message`` lines.

    The pattern checks of one call share one :func:`match_budget`.
    """
    validator = validator_for(schema)
    with match_budget():
        errors = list(validator.iter_errors(instance))
    out = []
    for error in sorted(errors, key=lambda e: list(map(str, e.absolute_path))):
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        out.append(f"{where}: {error.message}")
    return out


def validate(value: Any, schema: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every error of ``value`` as ``{path, message, validator}``, most relevant first, at most :data:`MAX_ERRORS`.

    The records a model reads in a re-ask; :func:`validation_errors` is the same check as text lines.
    """
    validator = validator_for(schema)
    with match_budget():  # every pattern check of this value shares one budget
        errors = sorted(validator.iter_errors(value), key=lambda e: (list(e.absolute_path), e.validator))
    if not errors:
        return []
    first = best_match(errors)
    out = []
    for error in [first, *[e for e in errors if e is not first]][:MAX_ERRORS]:
        message = error.message
        if error.validator == "additionalProperties":
            message = f"{message} (fields outside the schema are not accepted)"
        out.append({"path": "/" + "/".join(str(p) for p in error.absolute_path), "message": message,
                    "validator": error.validator})
    return out
