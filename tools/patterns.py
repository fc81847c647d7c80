"""Linear-time patterns and JSON Schema validation for client-supplied schemas.

A client's JSON Schema ``pattern`` meets client text in validation and in the decider's grounding.
Python's ``re`` backtracks: ``^(a+)+$`` over 30 characters holds a worker for minutes. Everything
here runs on RE2 (``google-re2``), whose matching time is linear in the text, or on fixed,
non-backtracking code:

- :func:`compile_pattern` — an ECMA-262 pattern (the JSON Schema flavour) translated to RE2 and
  compiled once; patterns RE2 cannot express (backreferences, lookaround) raise
  :class:`~tools.errors.UnsupportedPatternError` naming the schema path;
- :func:`check_schema_patterns` — every ``pattern`` / ``patternProperties`` key of a schema, checked
  at the boundary ("compile before you match");
- :func:`validator_for` — a Draft 2020-12 validator, cached per distinct schema, whose ``pattern``,
  ``patternProperties``, ``additionalProperties``, ``unevaluatedProperties`` and ``format`` checks
  never run a backtracking engine over instance data; :func:`validation_errors` lists its errors.

Linear is not free: when RE2's DFA runs out of its memory budget it falls back to an NFA whose
cost per character grows with the compiled program (a 2,000-instruction pattern over 1 MB took
98 s on one core). So every match is charged ``characters x program size`` before it runs: one
check may spend at most :data:`MAX_MATCH_COST`, and the checks inside a :func:`match_budget`
block (one validation) share :data:`DEFAULT_VALIDATION_COST`. Over budget is a typed
:class:`~tools.errors.PatternBudgetError` (a validation error message inside the validator),
never a stall.

Patterns are unanchored: ``search`` semantics, as JSON Schema says. ``\\d``, ``\\w`` and ``\\b`` are
ASCII as in ECMA-262 (and in RE2); ``\\s`` and ``.`` are widened to ECMA-262's sets of whitespace
and line terminators; ``\\uXXXX`` and ``(?<name>…)`` are rewritten to RE2's spelling.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema._utils import extras_msg  # the message jsonschema itself writes for extra properties

from tools.errors import PatternBudgetError, UnsupportedPatternError
from tools.schema_walk import pointer, subschemas

__all__ = [
    "DEFAULT_MAX_MATCHES",
    "DEFAULT_VALIDATION_COST",
    "MAX_FORMAT_LENGTH",
    "MAX_MATCH_COST",
    "MAX_PATTERN_LENGTH",
    "MAX_PROGRAM_SIZE",
    "SAFE_FORMAT_CHECKER",
    "SafePattern",
    "SafeValidator",
    "check_schema_patterns",
    "compile_pattern",
    "match_budget",
    "validation_errors",
    "validator_for",
]

#: Longest pattern accepted (characters); a schema pattern is a shape, not a program.
MAX_PATTERN_LENGTH = 4_096
#: Largest compiled RE2 program accepted (instructions).
MAX_PROGRAM_SIZE = 5_000
#: RE2 memory budget per pattern (bytes): bounds the program and the DFA cache of each cached pattern.
MAX_PATTERN_MEMORY = 2 << 20
#: Most work one match may cost, in characters x program instructions (worst case about 5e-8 s per
#: unit on one core when RE2 falls back to its NFA, so about half a second; usually far less).
MAX_MATCH_COST = 10_000_000
#: Work the checks inside one :func:`match_budget` block share (one validation of one value).
DEFAULT_VALIDATION_COST = 50_000_000
#: Matches :meth:`SafePattern.finditer` yields at most unless told otherwise.
DEFAULT_MAX_MATCHES = 1_000

# ECMA-262 WhiteSpace and LineTerminator code points, for ``\s`` (RE2's ``\s`` is [\t\n\f\r ]).
_ECMA_SPACE = (r"\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}"
               r"\x{3000}\x{feff}")
# ECMA-262 ``.`` matches anything but a line terminator (RE2's ``.`` only excludes \n).
_ECMA_DOT = r"[^\n\r\x{2028}\x{2029}]"
_HEX = frozenset("0123456789abcdefABCDEF")


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is a typed error, not a line on stderr
    options.max_mem = MAX_PATTERN_MEMORY
    return options


class _Refused(Exception):
    """A pattern the translator refuses; the message is the reason a client reads."""


class _Budget:
    __slots__ = ("left",)

    def __init__(self, cost: int) -> None:
        self.left = cost


_BUDGET: ContextVar[_Budget | None] = ContextVar("toolrail_pattern_budget", default=None)


@contextmanager
def match_budget(cost: int = DEFAULT_VALIDATION_COST) -> Iterator[None]:
    """Let every pattern match inside the block share one budget of ``cost`` units of work."""
    token = _BUDGET.set(_Budget(cost))
    try:
        yield
    finally:
        _BUDGET.reset(token)


@dataclass(frozen=True)
class SafePattern:
    """A compiled, linear-time pattern. Build it with :func:`compile_pattern`; share it freely."""

    source: str
    """The pattern as the schema wrote it (ECMA-262)."""
    translated: str
    """The same pattern in RE2's syntax."""
    program_size: int
    """Instructions of the compiled program: the cost of one character in the worst case."""
    _regex: Any = field(repr=False, compare=False)

    @property
    def max_text_length(self) -> int:
        """The longest text one match may scan within :data:`MAX_MATCH_COST`."""
        return MAX_MATCH_COST // self.program_size

    def _charge(self, length: int) -> None:
        cost = max(1, length) * self.program_size
        if cost > MAX_MATCH_COST:
            raise PatternBudgetError(f"a text of {length} characters is longer than pattern {self.source[:100]!r} may "
                                     f"check (at most {self.max_text_length})", pattern=self.source, length=length,
                                     limit=self.max_text_length)
        budget = _BUDGET.get()
        if budget is not None:
            if cost > budget.left:
                raise PatternBudgetError(f"the pattern-matching budget of this check is spent (pattern "
                                         f"{self.source[:100]!r}, {length} characters)", pattern=self.source,
                                         length=length)
            budget.left -= cost

    def search(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text`` (JSON Schema ``pattern`` semantics).

        Raises :class:`~tools.errors.PatternBudgetError` when the text is too long to check.
        """
        self._charge(len(text))
        return self._regex.search(text) is not None

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches all of ``text`` (budget as :meth:`search`)."""
        self._charge(len(text))
        return self._regex.fullmatch(text) is not None

    def finditer(self, text: str, *, max_matches: int = DEFAULT_MAX_MATCHES) -> Iterator[tuple[int, int, str]]:
        """Non-overlapping matches as ``(start, end, matched_text)``, leftmost first, at most ``max_matches``.

        Each search for the next match is charged for the rest of the text; a scan that would
        overspend raises :class:`~tools.errors.PatternBudgetError` before it starts.
        """
        self._charge(len(text))
        for count, match in enumerate(self._regex.finditer(text)):
            if count >= max_matches:
                return
            yield match.start(), match.end(), match.group()
            if match.end() < len(text):
                self._charge(len(text) - match.end())


def compile_pattern(pattern: str, *, path: str = "") -> SafePattern:
    """``pattern`` (ECMA-262, as in JSON Schema) compiled for RE2, once per distinct pattern.

    Raises :class:`~tools.errors.UnsupportedPatternError` carrying ``path`` (the JSON pointer of the
    pattern in its schema) when RE2 cannot express the pattern or it is larger than the limits.
    """
    compiled = _compile(pattern)
    if isinstance(compiled, str):
        raise UnsupportedPatternError(path, pattern, compiled)
    return compiled


@lru_cache(maxsize=256)  # x MAX_PATTERN_MEMORY: at most 512 MiB of RE2 state however many patterns arrive
def _compile(pattern: str) -> SafePattern | str:
    """The compiled pattern, or the reason it is refused (cached either way)."""
    if not isinstance(pattern, str):
        return "a pattern must be a string"
    if len(pattern) > MAX_PATTERN_LENGTH:
        return f"pattern longer than {MAX_PATTERN_LENGTH} characters"
    try:
        translated = _translate(pattern)
    except _Refused as exc:
        return str(exc)
    try:
        regex = re2.compile(translated, _options())
    except re2.error as exc:
        message = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(message, bytes):
            message = message.decode("utf-8", "replace")
        return f"not a pattern RE2 can run: {message}"
    if regex.programsize > MAX_PROGRAM_SIZE:
        return f"pattern compiles to {regex.programsize} instructions (at most {MAX_PROGRAM_SIZE})"
    return SafePattern(pattern, translated, regex.programsize, regex)


# ----------------------------------------------------------------- ECMA-262 → RE2


def _translate(pattern: str) -> str:
    """Rewrite an ECMA-262 pattern in RE2's syntax; raise :class:`_Refused` for what RE2 lacks."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        char = pattern[i]
        if char == "\\":
            text, i = _escape(pattern, i, in_class)
            out.append(text)
            continue
        if in_class:
            if char == "]":
                in_class = False
            elif char == "[":
                char = r"\["  # a literal in ECMA-262; RE2 would read [[:alpha:]] as a POSIX class
            out.append(char)
        elif char == "[":
            if pattern.startswith("[^]", i):
                out.append(r"(?s:.)")  # ECMA-262: any character
                i += 3
                continue
            if pattern.startswith("[]", i):
                out.append(r"[^\x00-\x{10ffff}]")  # ECMA-262: no character
                i += 2
                continue
            in_class = True
            out.append("[")
            if pattern.startswith("[^", i):
                out.append("^")
                i += 1
        elif char == "(":
            if pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
                raise _Refused("lookaround assertions ((?=, (?!, (?<=, (?<!) need a backtracking engine")
            if pattern.startswith("(?<", i):
                out.append("(?P<")  # a named group: RE2 spells it (?P<name>
                i += 3
                continue
            out.append(char)
        elif char == ".":
            out.append(_ECMA_DOT)
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The RE2 spelling of the escape at ``pattern[i]`` and the index after it."""
    if i + 1 >= len(pattern):
        raise _Refused("the pattern ends with a lone backslash")
    kind = pattern[i + 1]
    if kind in "123456789":
        if in_class:
            raise _Refused(f"octal escape \\{kind} in a character class")
        raise _Refused(f"backreference \\{kind} needs a backtracking engine")
    if kind == "k" and pattern.startswith("<", i + 2):
        raise _Refused("named backreference \\k<…> needs a backtracking engine")
    if kind == "u":
        return _unicode_escape(pattern, i)
    if kind == "c" and i + 2 < len(pattern) and pattern[i + 2].isascii() and pattern[i + 2].isalpha():
        return f"\\x{{{ord(pattern[i + 2]) % 32:x}}}", i + 3
    if kind == "0" and not (i + 2 < len(pattern) and pattern[i + 2].isdigit()):
        return r"\x{0}", i + 2
    if kind == "s":
        return (_ECMA_SPACE if in_class else f"[{_ECMA_SPACE}]"), i + 2
    if kind == "S" and not in_class:
        return f"[^{_ECMA_SPACE}]", i + 2
    if kind == "/":
        return "/", i + 2
    return pattern[i:i + 2], i + 2  # \d \w \b \n \t \x41 \p{L} \. …: RE2 spells them alike or refuses them


def _unicode_escape(pattern: str, i: int) -> tuple[str, int]:
    """``\\uXXXX`` (with surrogate pairs) and ``\\u{X…}`` as RE2's ``\\x{…}``."""
    if pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        digits = pattern[i + 3:end] if end > 0 else ""
        if not digits or not set(digits) <= _HEX or int(digits, 16) > 0x10FFFF:
            raise _Refused(f"invalid escape {pattern[i:i + 12]!r}")
        return f"\\x{{{digits}}}", end + 1
    digits = pattern[i + 2:i + 6]
    if len(digits) != 4 or not set(digits) <= _HEX:
        raise _Refused(f"invalid escape {pattern[i:i + 6]!r} (\\u takes four hex digits)")
    code = int(digits, 16)
    end = i + 6
    if 0xD800 <= code <= 0xDBFF:
        low = pattern[end + 2:end + 6] if pattern.startswith("\\u", end) else ""
        if len(low) == 4 and set(low) <= _HEX and 0xDC00 <= int(low, 16) <= 0xDFFF:
            code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)
            end += 6
        else:
            raise _Refused(f"lone surrogate {pattern[i:i + 6]!r} can match no text")
    elif 0xDC00 <= code <= 0xDFFF:
        raise _Refused(f"lone surrogate {pattern[i:i + 6]!r} can match no text")
    return f"\\x{{{code:x}}}", end


# ----------------------------------------------------------------- schema patterns


def check_schema_patterns(schema: Any, *, path: str = "") -> None:
    """Compile every pattern of ``schema``; raise :class:`UnsupportedPatternError` for the first refused.

    ``path`` prefixes the JSON pointers in errors (e.g. ``/tools/0/function/parameters``).
    """
    for where, node in subschemas(schema, path):
        if "pattern" in node:
            if not isinstance(node["pattern"], str):
                raise UnsupportedPatternError(pointer(where, "pattern"), repr(node["pattern"]), "a pattern must be a string")
            compile_pattern(node["pattern"], path=pointer(where, "pattern"))
        if isinstance(node.get("patternProperties"), Mapping):
            for key in node["patternProperties"]:
                compile_pattern(key, path=pointer(where, "patternProperties", key))


# ----------------------------------------------------------------- formats

def _shape(pattern: str) -> Any:
    """A fixed, small pattern of ours on RE2; its inputs are capped at :data:`MAX_FORMAT_LENGTH`."""
    regex = re2.compile(pattern, _options())
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
    return isinstance(_compile(value), SafePattern)


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
