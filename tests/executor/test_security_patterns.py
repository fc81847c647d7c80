"""Linear-time patterns: client patterns over client text never backtrack (issue 18, finding 1).

Plain functions, no server: ``tools.patterns`` is what validation and the decider call.
"""

from __future__ import annotations

import time

import pytest

from tools import patterns
from tools.errors import PatternBudgetError, UnsupportedPatternError
from tools.patterns import MAX_MATCH_COST, check_schema_patterns, compile_pattern, match_budget
from tools.validator import validate, validation_errors, validator_for

EVIL = r"^(a+)+$"


def test_all_is_sorted() -> None:
    assert patterns.__all__ == sorted(patterns.__all__)


def test_backtracking_pattern_answers_in_linear_time() -> None:
    text = "a" * 10_000 + "!"
    pattern = compile_pattern(EVIL)
    started = time.perf_counter()
    assert pattern.search(text) is False
    assert pattern.search("a" * 10_000) is True
    assert time.perf_counter() - started < 0.05


def test_validation_with_a_backtracking_pattern_is_fast() -> None:
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": EVIL}}}
    started = time.perf_counter()
    errors = validate({"code": "a" * 10_000 + "!"}, schema)
    assert time.perf_counter() - started < 0.05
    assert [e["validator"] for e in errors] == ["pattern"]
    assert "does not match '^(a+)+$'" in errors[0]["message"] and "10001 characters" in errors[0]["message"]


@pytest.mark.parametrize(("pattern", "reason"), [
    (r"^(a)\1$", "backreference"),
    (r"(?<x>a)\k<x>", "named backreference"),
    (r"foo(?=bar)", "lookaround"),
    (r"(?<!a)b", "lookaround"),
    (r"a{5000}", "repetition"),
    (r"\ud800", "surrogate"),
    ("a" * 5000, "longer than"),
])
def test_patterns_re2_cannot_run_are_refused_with_the_path(pattern: str, reason: str) -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"sku": {"type": "string", "pattern": pattern}}}}}}
    with pytest.raises(UnsupportedPatternError) as caught:
        check_schema_patterns(schema, path="/tools/0/function/parameters")
    error = caught.value
    assert error.path == "/tools/0/function/parameters/properties/items/items/properties/sku/pattern"
    assert error.pattern == pattern and reason in error.reason
    assert error.to_dict()["type"] == "unsupported_pattern"
    with pytest.raises(UnsupportedPatternError):
        validator_for(schema)


def test_pattern_properties_keys_are_checked_and_data_keywords_are_not() -> None:
    with pytest.raises(UnsupportedPatternError) as caught:
        check_schema_patterns({"patternProperties": {r"^(x)\1": {"type": "string"}}})
    assert caught.value.path == "/patternProperties/^(x)\\1"
    # A property named "pattern" and a default holding a "pattern" are data, not patterns.
    check_schema_patterns({"type": "object", "properties": {"pattern": {"type": "string"}},
                           "default": {"pattern": r"(a)\1"}, "examples": [{"pattern": "(?=x)"}]})


def test_ecma_262_spellings_are_translated() -> None:
    assert compile_pattern(r"^\u00e9t\u00E9$").search("été")
    assert compile_pattern(r"^\uD83D\uDE00$").search("\U0001F600")  # a surrogate pair is one code point
    assert compile_pattern(r"^\u{1F600}$").search("\U0001F600")
    assert compile_pattern(r"^(?<year>\d{4})-\d{2}$").search("2024-05")
    assert compile_pattern(r"^a\sb$").search("a\u00a0b")  # ECMA-262 \s includes no-break space
    assert not compile_pattern(r"^a\Sb$").search("a\u3000b")
    assert not compile_pattern(r"^a.b$").search("a\u2028b")  # . stops at line terminators
    assert compile_pattern(r"^a[^]b$").search("a\nb")
    assert not compile_pattern(r"a[]").search("a")
    assert not compile_pattern(r"^\d+$").search("٣")  # \d is ASCII, as in ECMA-262
    assert compile_pattern(r"^[[a]+$").search("[a[")
    assert compile_pattern(r"^\/x$").search("/x")
    assert not compile_pattern(r"^abc$").search("abc\n")  # $ is the end of input, not before a newline


def test_finditer_gives_character_offsets_and_is_capped() -> None:
    pattern = compile_pattern(r"[A-Z]{2}-\d{3}")
    text = "订单 AB-123 和 CD-456"
    assert list(pattern.finditer(text)) == [(3, 9, "AB-123"), (12, 18, "CD-456")]
    assert len(list(compile_pattern("a").finditer("a" * 5000, max_matches=10))) == 10
    assert compile_pattern("^x").fullmatch("x") and not compile_pattern("x").fullmatch("xx")


def test_compiled_patterns_are_shared() -> None:
    assert compile_pattern(r"^\d{3}$") is compile_pattern(r"^\d{3}$")
    schema_a = {"type": "string", "pattern": "^a", "minLength": 1}
    schema_b = {"minLength": 1, "pattern": "^a", "type": "string"}
    assert validator_for(schema_a) is validator_for(schema_b)


def test_over_budget_text_is_a_typed_error_not_a_stall() -> None:
    big = compile_pattern(r"[a-z]{1000}[a-z]{1000}0")  # DFA blow-up: RE2 falls back to its slow NFA
    too_long = "a" * (big.max_text_length + 1)
    started = time.perf_counter()
    with pytest.raises(PatternBudgetError):
        big.search(too_long)
    assert time.perf_counter() - started < 0.05  # refused before the scan, not after it
    assert big.max_text_length * big.program_size <= MAX_MATCH_COST
    errors = validation_errors({"type": "string", "pattern": big.source}, too_long)
    assert len(errors) == 1 and "longer than pattern" in errors[0]
    small = compile_pattern(r"^\d+$")
    with match_budget(small.program_size * 10), pytest.raises(PatternBudgetError):
        for _ in range(3):
            small.search("12345")


def test_hostile_property_names_and_unevaluated_properties() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}},
              "patternProperties": {EVIL: {"type": "string"}}, "additionalProperties": False}
    hostile = "a" * 20_000 + "!"
    started = time.perf_counter()
    errors = validation_errors(schema, {"id": 1, hostile: "x", "aaa": 3})
    assert time.perf_counter() - started < 0.05
    assert any("does not match any of the regexes" in e for e in errors)
    assert any(e.startswith("/aaa:") and "not of type 'string'" in e for e in errors)
    unevaluated = {"type": "object", "patternProperties": {EVIL: True}, "unevaluatedProperties": False}
    started = time.perf_counter()
    errors = validation_errors(unevaluated, {hostile: 1, "aa": 2})
    assert time.perf_counter() - started < 0.05
    assert len(errors) == 1 and "Unevaluated properties are not allowed" in errors[0] and "'aa'" not in errors[0]


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date", "2024-02-29", "2023-02-29"),
    ("date-time", "2024-05-01T09:30:00Z", "2024-05-01 25:00"),
    ("time", "15:00", "15:60"),
    ("time", "08:15:30+08:00", "8am"),
    ("email", "lee@example.com", "lee.example.com"),
    ("hostname", "api.example.com", "-bad-.example.com"),
    ("ipv4", "10.0.0.1", "10.0.0.256"),
    ("ipv6", "::1", "::g"),
    ("uri", "https://example.com/a?b=c", "no scheme here"),
    ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
    ("duration", "P1DT2H", "PT"),
    ("regex", r"^\d+$", r"(a)\1"),
])
def test_formats_are_checked_without_backtracking(fmt: str, good: str, bad: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert validation_errors(schema, good) == []
    assert validation_errors(schema, bad) == [f"/: {bad!r} is not a {fmt!r}"]


def test_format_checks_of_huge_strings_are_bounded() -> None:
    started = time.perf_counter()
    for fmt in ("email", "uri", "hostname", "date-time", "uuid"):
        assert validation_errors({"format": fmt}, "a" * 200_000 + "@")  # too long to be one: refused unread
    assert time.perf_counter() - started < 0.05
