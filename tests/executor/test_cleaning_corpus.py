"""The cleaner on a hand-written corpus of broken model outputs, and each step on its own.

Corpus rows (``data/cleaning_corpus.jsonl``) hold ``{id, tool, raw, level, expect}``:

- ``level``: ``arguments`` runs ``check_arguments(spec, raw)``; ``output`` runs
  ``check_output(raw, specs)`` over every built-in tool;
- ``expect``: ``{"arguments": {...}}`` (one valid call with exactly these arguments),
  ``{"calls": [{name, arguments}, ...]}`` (output level, every call valid),
  ``{"error_path", "validator"}`` (the first error) or ``{"error": true}`` with an
  optional ``message`` substring;
- optional ``expand``: ``{placeholder: [unit, count]}`` builds huge or deep inputs
  without storing them; optional ``xfail``: a known bug outside the cleaner, by reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.cleaning import (
    TEXT_STEPS,
    Draft,
    apply_aliases,
    clean_text,
    clean_value,
    close_truncated,
    coerce_scalars,
    extract_json_span,
    fill_defaults,
    normalize_value,
    relex,
    strip_code_fences,
)
from executor.errors import CleaningError
from tools.check import CallCheck, OutputCheck, check_arguments, check_output
from tools.registry import builtin_specs

CORPUS = Path(__file__).parent / "data" / "cleaning_corpus.jsonl"
SPECS = {spec.name: spec for spec in builtin_specs()}


def load_corpus() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        for placeholder, (unit, count) in row.get("expand", {}).items():
            row["raw"] = row["raw"].replace(placeholder, unit * count)
    return rows


ROWS = load_corpus()


def exactly(value: Any) -> Any:
    """``value`` with every scalar tagged by its type, so 100 and 100.0 and True differ."""
    if isinstance(value, dict):
        return {key: exactly(item) for key, item in value.items()}
    if isinstance(value, list):
        return [exactly(item) for item in value]
    return (type(value).__name__, value)


def _calls_of(row: dict[str, Any]) -> tuple[list[CallCheck], list[dict[str, Any]]]:
    """(checked calls, every error) of one corpus row."""
    if row["level"] == "arguments":
        call = check_arguments(SPECS[row["tool"]], row["raw"])
        return [call], list(call.errors)
    check: OutputCheck = check_output(row["raw"], SPECS)
    return check.calls, check.all_errors()


def _params() -> list[Any]:
    params = []
    for row in ROWS:
        marks = [pytest.mark.xfail(reason=row["xfail"], strict=True)] if "xfail" in row else []
        params.append(pytest.param(row, id=row["id"], marks=marks))
    return params


def test_corpus_is_large_and_covers_every_category() -> None:
    assert len(ROWS) >= 70
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    prefixes = {row["id"].split("-")[0] for row in ROWS}
    assert {"fence", "prose", "cnq", "fw", "inside", "trailing", "single", "python", "bare", "missing", "trunc",
            "extra", "type", "enum", "alias", "tagged", "openai", "empty", "huge", "deep"} <= prefixes
    for row in ROWS:
        assert row["tool"] in SPECS and row["level"] in {"arguments", "output"}
        assert set(row["expect"]) in ({"arguments"}, {"calls"}, {"error_path", "validator"}, {"error"}, {"error", "message"})


@pytest.mark.parametrize("row", _params())
def test_corpus_row(row: dict[str, Any]) -> None:
    calls, errors = _calls_of(row)
    expect = row["expect"]
    if "arguments" in expect or "calls" in expect:
        wanted = expect["calls"] if "calls" in expect else [{"name": row["tool"], "arguments": expect["arguments"]}]
        assert errors == [], errors
        assert [(c.name, exactly(c.arguments)) for c in calls] == [(w["name"], exactly(w["arguments"])) for w in wanted]
    elif "error_path" in expect:
        assert errors, f"accepted: {[c.arguments for c in calls]}"
        assert (errors[0]["path"], errors[0].get("validator")) == (expect["error_path"], expect["validator"]), errors
        assert all(c.arguments is None for c in calls)
    else:
        assert errors, f"accepted: {[c.arguments for c in calls]}"
        assert all(c.arguments is None for c in calls)
        if "message" in expect:
            assert any(expect["message"] in err.get("message", "") for err in errors), errors


def test_repaired_rows_carry_repair_notes() -> None:
    """A repaired row says what was repaired; a row that was valid JSON and canonical says nothing."""
    call = check_arguments(SPECS["get_weather"], "{“city”：“沪”，“date”：“明天”}")
    assert call.ok
    assert any("full-width" in note for note in call.repairs)
    assert any("alias '沪' → 'Shanghai'" in note for note in call.repairs)
    clean = check_arguments(SPECS["query_balance"], '{"account": "alice"}')
    assert clean.ok and clean.repairs == ()


# ---------------------------------------------------------------- text steps, one at a time


def run_step(step: Any, text: str, **fields: Any) -> Draft:
    return step(Draft(text=text, **fields))


class TestStripCodeFences:
    def test_fenced_json_becomes_its_inside(self) -> None:
        draft = run_step(strip_code_fences, 'x\n```json\n{"a": 1}\n```\ny')
        assert draft.text == '{"a": 1}'
        assert draft.notes == ("stripped a ```json code fence",)

    def test_unterminated_fence_keeps_the_rest(self) -> None:
        assert run_step(strip_code_fences, '```\n{"a": 1}').text == '{"a": 1}'

    def test_backticks_inside_json_are_content(self) -> None:
        text = "{'a': '```b```'}"
        assert run_step(strip_code_fences, text) == Draft(text=text)

    def test_text_without_fence_is_untouched(self) -> None:
        assert run_step(strip_code_fences, '{"a": 1}') == Draft(text='{"a": 1}')


class TestExtractJsonSpan:
    def test_prose_before_and_after(self) -> None:
        draft = run_step(extract_json_span, 'Sure: {"a": "}"} done.')
        assert draft.text == '{"a": "}"}'
        assert "extracted JSON" in draft.notes[0]

    def test_closing_bracket_inside_curly_quotes_is_content(self) -> None:
        assert run_step(extract_json_span, "好的：{“a”：“}”} 完").text == "{“a”：“}”}"

    def test_truncated_span_keeps_everything_after_the_opener(self) -> None:
        assert run_step(extract_json_span, 'call: {"a": ["b"').text == '{"a": ["b"'

    def test_exact_json_is_untouched(self) -> None:
        assert run_step(extract_json_span, '[1, 2]') == Draft(text="[1, 2]")

    @pytest.mark.parametrize("raw", ["", "  nothing here ", "a: b, c"])
    def test_text_without_brackets_holds_no_json(self, raw: str) -> None:
        with pytest.raises(CleaningError, match="no JSON"):
            run_step(extract_json_span, raw)


class TestRelex:
    @pytest.mark.parametrize(("raw", "canonical"), [
        ("{“a”：“b”，“c”：［1］}", '{"a":"b","c":[1]}'),
        ("{'a': 'it\\'s'}", '{"a":"it\'s"}'),
        ("{「a」: 『b』}", '{"a":"b"}'),
        ("{a: True, b: None, c: FALSE}", '{"a":true,"b":null,"c":false}'),
        ('{"a": 1 "b": 2}', '{"a":1,"b":2}'),
        ('{"a": "x" "b": "y"}', '{"a":"x","b":"y"}'),
        ('[1, 2, ]', "[1,2]"),
        ('{"a": 1,, "b": 2,}', '{"a":1,"b":2}'),
        ('{a: 张三}', '{"a":"张三"}'),
        ('{"a": "x、y：z"、"b": 1}', '{"a":"x、y：z","b":1}'),
    ])
    def test_canonical_output(self, raw: str, canonical: str) -> None:
        assert run_step(relex, raw).text == canonical

    def test_contents_of_every_quote_style_are_kept(self) -> None:
        inner = "“x”‘y’「z」『w』：，｛｝［］、"
        for open_, close in [("'", "'"), ("“", "”"), ("「", "」"), ("『", "』")]:
            draft = run_step(relex, "{" + open_ + "k" + close + ":" + open_ + inner.replace(close, "") + close + "}")
            assert json.loads(draft.text) == {"k": inner.replace(close, "")}

    def test_ascii_double_quote_inside_curly_string_is_escaped(self) -> None:
        assert json.loads(run_step(relex, '{“a”: “say "hi"”}').text) == {"a": 'say "hi"'}

    def test_invalid_escape_is_kept_literally(self) -> None:
        draft = run_step(relex, r"{'a': 'C:\qux\n'}")
        assert json.loads(draft.text) == {"a": "C:\\qux\n"}
        assert any("invalid escapes" in note for note in draft.notes)

    def test_open_brackets_and_last_token_are_recorded(self) -> None:
        draft = run_step(relex, '{"a": [1, "x"')
        assert draft.open_brackets == ("}", "]")
        assert draft.last_token == "value"
        assert run_step(relex, '{"a": 1').last_token == "number"
        assert run_step(relex, '{"a": tr').last_token == "word"
        assert run_step(relex, '{"a": "b", "c"').last_token == "key"
        assert run_step(relex, '{"a":').last_token == "colon"

    @pytest.mark.parametrize(("raw", "message"), [
        ('{"a": "b', "cut inside a string"),
        ('{"a": "b"]', "unbalanced"),
        ('{"a": NaN}', "not a JSON value"),
        ("[" * 100, "deeper than"),
    ])
    def test_refusals(self, raw: str, message: str) -> None:
        with pytest.raises(CleaningError, match=message):
            run_step(relex, raw)


class TestCloseTruncated:
    def test_nothing_open_is_untouched(self) -> None:
        assert run_step(close_truncated, '{"a":1}') == Draft(text='{"a":1}')

    @pytest.mark.parametrize(("raw", "closed"), [
        ('{"a": "b"', '{"a":"b"}'),
        ('{"a": ["b", true', '{"a":["b",true]}'),
        ('{"a": 10,', '{"a":10}'),
        ('[{"a": {}}', '[{"a":{}}]'),
    ])
    def test_cut_on_a_value_boundary_is_closed(self, raw: str, closed: str) -> None:
        draft = close_truncated(run_step(relex, raw))
        assert draft.text == closed and draft.open_brackets == ()
        assert "closed" in draft.notes[-1]

    @pytest.mark.parametrize("raw", ['{"a": 10', '{"a": 1.', '{"a": -', '{"a": nul', '{"a": "b", "c"', '{"a":', '{"a": [',
                                     '{"a": {', "{"])
    def test_cut_inside_a_value_is_refused(self, raw: str) -> None:
        with pytest.raises(CleaningError, match="cut"):
            close_truncated(run_step(relex, raw))


class TestCleanText:
    def test_valid_json_is_parsed_without_notes(self) -> None:
        assert clean_text('{"a": "“b”"}') == ({"a": "“b”"}, ())

    def test_steps_run_in_order(self) -> None:
        assert [step.__name__ for step in TEXT_STEPS] == ["strip_invisible", "strip_code_fences", "strip_comments",
                                                       "extract_json_span", "relex",
                                                       "close_truncated"]
        value, notes = clean_text("Here:\n```json\n{'a': 1,}\n```")
        assert value == {"a": 1}
        assert len(notes) >= 3

    @pytest.mark.parametrize("raw", ["", "   ", "no json at all", "```\n```", '{"a": NaN}', '{"a": Infinity}'])
    def test_nothing_to_parse_is_a_cleaning_error(self, raw: str) -> None:
        with pytest.raises(CleaningError):
            clean_text(raw)

    def test_oversized_output_is_refused_before_parsing(self) -> None:
        with pytest.raises(CleaningError, match="exceeds"):
            clean_text("[" + "1," * 150_000 + "1]")


# ---------------------------------------------------------------- value steps, one at a time

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "city": {"type": "string", "x-aliases": {"沪": "Shanghai", "NYC": "New York"}},
        "date": {"type": "string", "enum": ["today", "tomorrow"], "x-aliases": {"明天": "tomorrow"}},
        "count": {"type": "integer"},
        "price": {"type": "number"},
        "flag": {"type": "boolean"},
        "label": {"type": "string"},
        "either": {"type": ["string", "number"]},
        "unit": {"type": "string", "default": "celsius"},
        "nested": {"type": "object", "properties": {"n": {"type": "integer"}, "m": {"type": "string", "default": "x"}}},
        "items": {"type": "array", "items": {"type": "object", "properties": {"q": {"type": "number"}}}},
    },
}


class TestApplyAliases:
    def test_alias_to_canonical(self) -> None:
        value, notes = apply_aliases({"city": "沪", "date": "明天"}, SCHEMA)
        assert value == {"city": "Shanghai", "date": "tomorrow"}
        assert notes == ["/city: alias '沪' → 'Shanghai'", "/date: alias '明天' → 'tomorrow'"]

    def test_case_and_space_insensitive(self) -> None:
        assert apply_aliases({"city": " nyc "}, SCHEMA)[0] == {"city": "New York"}

    def test_unknown_values_and_non_strings_are_left(self) -> None:
        assert apply_aliases({"city": "后天", "date": 3}, SCHEMA) == ({"city": "后天", "date": 3}, [])


class TestCoerceScalars:
    @pytest.mark.parametrize(("field", "raw", "coerced"), [
        ("count", "100", 100), ("count", " 7 ", 7), ("count", "1,000", 1000), ("count", "3.0", 3), ("count", 4.0, 4),
        ("price", "100", 100), ("price", "2.50", 2.5), ("price", "1e3", 1000.0), ("price", "12,345.5", 12345.5),
        ("flag", "true", True), ("flag", "False", False),
        ("label", 42, "42"),
        ("date", "Today", "today"), ("date", " TOMORROW ", "tomorrow"),
    ])
    def test_unambiguous_coercions(self, field: str, raw: Any, coerced: Any) -> None:
        value, notes = coerce_scalars({field: raw}, SCHEMA)
        assert exactly(value) == exactly({field: coerced})
        assert notes and notes[0].startswith(f"/{field}: coerced")

    @pytest.mark.parametrize(("field", "raw"), [
        ("count", "abc"), ("count", "3.5"), ("count", True), ("price", "abc"), ("price", ""), ("price", "100元"),
        ("price", "NaN"), ("price", "0x10"), ("flag", "yes"), ("flag", 1), ("label", 1.5), ("label", True),
        ("either", "100"), ("date", "后天"),
    ])
    def test_ambiguous_or_impossible_values_are_left(self, field: str, raw: Any) -> None:
        assert exactly(coerce_scalars({field: raw}, SCHEMA)[0]) == exactly({field: raw})

    def test_nested_objects_and_arrays_are_coerced(self) -> None:
        value, _ = coerce_scalars({"nested": {"n": "5"}, "items": [{"q": "1.5"}, {"q": 2}]}, SCHEMA)
        assert value == {"nested": {"n": 5}, "items": [{"q": 1.5}, {"q": 2}]}


class TestFillDefaults:
    def test_missing_optional_fields_get_defaults(self) -> None:
        value, notes = fill_defaults({"nested": {}}, SCHEMA)
        assert value == {"unit": "celsius", "nested": {"m": "x"}}
        assert notes == ["/unit: default 'celsius'", "/nested/m: default 'x'"]

    def test_present_fields_are_kept(self) -> None:
        assert fill_defaults({"unit": "fahrenheit"}, SCHEMA) == ({"unit": "fahrenheit"}, [])


class TestValueSteps:
    def test_extra_fields_are_never_dropped(self) -> None:
        value, _ = clean_value({"city": "沪", "surprise": 1}, SCHEMA)
        assert value["surprise"] == 1

    @pytest.mark.parametrize("step", [apply_aliases, coerce_scalars, fill_defaults, clean_value, normalize_value])
    def test_steps_do_not_mutate_their_input(self, step: Any) -> None:
        original = {"city": "沪", "count": "3", "nested": {"n": "1"}, "items": [{"q": "2"}]}
        snapshot = json.loads(json.dumps(original))
        step(original, SCHEMA)
        assert original == snapshot

    def test_normalize_does_not_coerce(self) -> None:
        value, _ = normalize_value({"city": "沪", "count": "3"}, SCHEMA)
        assert value == {"city": "Shanghai", "count": "3", "unit": "celsius"}
