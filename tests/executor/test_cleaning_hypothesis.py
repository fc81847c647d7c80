"""Properties of the cleaner under generated input.

- valid JSON, however unicode-heavy (Chinese quotes and full-width punctuation inside
  strings), comes back as the same value — from ``clean_text`` and from the text steps
  run directly, so the lenient re-lexer itself is held to it;
- arbitrary text, deep nesting and huge input end in a value or a ``CleaningError``,
  never another exception, within a bounded time; the pipeline entry points never raise;
- value steps never mutate their input.

The default run is kept short; ``-m slow`` runs the same properties with many more examples.
"""

from __future__ import annotations

import copy
import json
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.cleaning import TEXT_STEPS, Draft, apply_aliases, clean_text, clean_value, coerce_scalars, fill_defaults, normalize_value
from executor.errors import CleaningError
from tools.check import check_arguments, check_output
from tools.registry import builtin_specs

SPECS = {spec.name: spec for spec in builtin_specs()}

#: Characters the lenient lexer treats as syntax outside strings, and prose around them.
TRICKY = "“”‘’「」『』＂„：，、｛｝［］\u3000'\"\\{}[]:,`\n\t 上海沪明天后天美元TrueFalseNonenull0123456789.-eE"
tricky_text = st.text(alphabet=st.sampled_from(TRICKY), max_size=40)
unicode_text = st.one_of(st.text(max_size=30), tricky_text)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False), unicode_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(unicode_text, children, max_size=5)),
    max_leaves=25,
)
json_containers = st.one_of(st.lists(json_values, max_size=5), st.dictionaries(unicode_text, json_values, max_size=5))
dumps_options = st.fixed_dictionaries({"ensure_ascii": st.booleans(), "indent": st.sampled_from([None, 2]),
                                       "separators": st.sampled_from([None, (",", ":")])})

FAST = settings(max_examples=60, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=2000, deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow])

#: Generous wall-clock bound for one input of up to ~250k characters on a shared machine.
MAX_SECONDS = 3.0


def run_text_steps(text: str) -> Any:
    draft = Draft(text=text)
    for step in TEXT_STEPS:
        draft = step(draft)
    return json.loads(draft.text)


def same(a: Any, b: Any) -> bool:
    """Equal, with the JSON type of every scalar equal too (1 vs 1.0 vs True)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------- valid JSON is never changed


def check_roundtrip(value: Any, options: dict[str, Any]) -> None:
    text = json.dumps(value, **options)
    cleaned, notes = clean_text(text)
    assert same(cleaned, value) and notes == ()


def check_text_steps_keep_valid_json(value: Any, options: dict[str, Any]) -> None:
    assert same(run_text_steps(json.dumps(value, **options)), value)


@FAST
@given(json_values, dumps_options)
def test_clean_text_returns_valid_json_unchanged(value: Any, options: dict[str, Any]) -> None:
    check_roundtrip(value, options)


@FAST
@given(json_containers, dumps_options)
def test_text_steps_never_change_valid_json(value: Any, options: dict[str, Any]) -> None:
    check_text_steps_keep_valid_json(value, options)


@FAST
@given(st.dictionaries(tricky_text, tricky_text, min_size=1, max_size=4), st.sampled_from(["```json\n{}\n```", "Sure: {} ok", "{}"]))
def test_wrapped_valid_json_keeps_its_strings(value: dict[str, str], wrapper: str) -> None:
    """Fences and prose are removed; Chinese quotes and full-width punctuation inside strings stay."""
    text = wrapper.replace("{}", json.dumps(value, ensure_ascii=False))
    assert clean_text(text)[0] == value


@FAST
@given(st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=6),
                       st.text(alphabet=st.characters(blacklist_characters="“”\\", blacklist_categories=("Cs",)), max_size=20),
                       min_size=1, max_size=4))
def test_curly_quoted_strings_keep_their_contents(value: dict[str, str]) -> None:
    """The same object written with “…” quotes and full-width ： ， as syntax parses to the same value."""
    text = "{" + "，".join(f"“{k}”：“{v}”" for k, v in value.items()) + "}"
    assert clean_text(text)[0] == value


# ---------------------------------------------------------------- anything else: a value or a CleaningError


#: Python refuses to parse integers longer than this; tools/check.py's own strict
#: ``json.loads`` does not catch that yet (see ``test_pipeline_survives_huge_integers``).
LONG_DIGIT_RUN = re.compile(r"\d{4000}")


def check_bounded(text: str) -> None:
    started = time.perf_counter()
    try:
        clean_text(text)
    except CleaningError:
        pass
    if LONG_DIGIT_RUN.search(text):
        assert time.perf_counter() - started < MAX_SECONDS
        return
    call = check_arguments(SPECS["transfer"], text)
    assert call.ok or call.errors
    output = check_output(text, SPECS)
    assert output.ok or output.all_errors() or not output.calls
    assert time.perf_counter() - started < MAX_SECONDS


nested = st.recursive(st.sampled_from(["1", '"a"', "x", "“b”", "", "true"]),
                      lambda inner: st.one_of(
                          st.tuples(st.sampled_from("[{［｛"), st.lists(inner, max_size=3), st.sampled_from(["]", "}", "］", "｝", ""])).map(
                              lambda t: t[0] + st_join(t[1]) + t[2]),
                          st.tuples(inner, st.sampled_from([":", "：", ",", "，", ""]), inner).map("".join)),
                      max_leaves=40)


def st_join(parts: list[str]) -> str:
    return ",".join(parts)


@FAST
@given(st.one_of(st.text(max_size=200), tricky_text, nested))
def test_arbitrary_text_is_a_value_or_a_cleaning_error(text: str) -> None:
    check_bounded(text)


@FAST
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", "{", "［", "{\"a\":", "[1,", "{'a': [", "“"]),
       st.sampled_from(["", "]", "}", "1", ","]))
def test_deep_nesting_is_refused_or_parsed(depth: int, opener: str, tail: str) -> None:
    check_bounded(opener * depth + tail * depth)


@settings(FAST, max_examples=8)
@given(st.text(alphabet=st.sampled_from(TRICKY), min_size=1, max_size=8), st.integers(min_value=10_000, max_value=60_000))
def test_huge_input_finishes_in_bounded_time(chunk: str, repeat: int) -> None:
    check_bounded(chunk * repeat)


def test_cleaner_refuses_huge_integers() -> None:
    with pytest.raises(CleaningError):
        clean_text("{'amount': " + "1" * 5000 + "}")
    assert clean_text('{"amount": ' + "1" * 4000 + "}")[0] == {"amount": int("1" * 4000)}


def test_pipeline_survives_huge_integers() -> None:
    call = check_arguments(SPECS["transfer"], '{"amount": ' + "1" * 5000 + "}")
    assert call.errors


# ---------------------------------------------------------------- value steps are pure

STEP_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "x-aliases": {"沪": "Shanghai"}},
        "n": {"type": "number"},
        "flag": {"type": "boolean"},
        "when": {"type": "string", "enum": ["today", "tomorrow"], "default": "today"},
        "inner": {"type": "object", "properties": {"k": {"type": "integer", "default": 1}}},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"q": {"type": "number"}}}},
    },
}
step_inputs = st.dictionaries(st.sampled_from(["city", "n", "flag", "when", "inner", "rows", "other"]), json_values, max_size=6)


@FAST
@given(step_inputs, st.sampled_from([apply_aliases, coerce_scalars, fill_defaults, clean_value, normalize_value]))
def test_value_steps_never_mutate_their_input(value: dict[str, Any], step: Any) -> None:
    snapshot = copy.deepcopy(value)
    step(value, STEP_SCHEMA)
    assert same(value, snapshot)


@FAST
@given(step_inputs)
def test_value_steps_never_drop_a_field(value: dict[str, Any]) -> None:
    cleaned, _ = clean_value(value, STEP_SCHEMA)
    assert set(value) <= set(cleaned)


# ---------------------------------------------------------------- the same properties, many more examples


@pytest.mark.slow
@SLOW
@given(json_values, dumps_options)
def test_slow_clean_text_returns_valid_json_unchanged(value: Any, options: dict[str, Any]) -> None:
    check_roundtrip(value, options)


@pytest.mark.slow
@SLOW
@given(json_containers, dumps_options)
def test_slow_text_steps_never_change_valid_json(value: Any, options: dict[str, Any]) -> None:
    check_text_steps_keep_valid_json(value, options)


@pytest.mark.slow
@SLOW
@given(st.one_of(st.text(max_size=2000), tricky_text, nested))
def test_slow_arbitrary_text_is_a_value_or_a_cleaning_error(text: str) -> None:
    check_bounded(text)
