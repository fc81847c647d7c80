"""The unseen-split metrics measure what they claim to, on invented schemas, tools and rows (no model)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a plain directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench import quality, quality_scoring  # noqa: E402
from bench.quality import run_cases  # noqa: E402
from bench.quality_cases import Case  # noqa: E402
from bench.quality_schema import admitted_outcomes, canonical_arguments, validation_errors  # noqa: E402
from bench.quality_scoring import (  # noqa: E402
    conversation_text,
    headline,
    is_composition,
    markdown_table,
    score_row,
    summarize,
)
from decider.protocol import DecideRequest, Decision  # noqa: E402
from tools.calls import ToolCall  # noqa: E402
from tools.spec import ToolSpec  # noqa: E402

INF = float("inf")

# ---------------------------------------------------------------------------------------------
# admitted_outcomes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("schema", "count"), [
    ({"const": "x"}, 1),
    ({"enum": ["a", "b", "c"]}, 3),
    ({"enum": ["a", "a"]}, 1),
    ({"type": "boolean"}, 2),
    ({"type": "null"}, 1),
    ({"type": ["boolean", "null"]}, 3),
    ({"type": "integer", "minimum": 1, "maximum": 5}, 5),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 5}, 3),
    ({"type": "integer", "minimum": 3, "maximum": 2}, 0),
    ({"type": "integer", "minimum": 1}, INF),
    ({"type": "number", "minimum": 2, "maximum": 2}, 1),
    ({"type": "number", "minimum": 0, "maximum": 1}, INF),
    ({"type": "string"}, INF),
    ({"type": "string", "pattern": "^[a-z]$"}, INF),
    ({"type": "string", "format": "email"}, INF),
    ({"type": "string", "maxLength": 0}, 1),
    ({}, INF),
    (True, INF),
    (False, 0),
    ({"anyOf": [{"const": 1}, {"enum": [2, 3]}]}, 3),
    ({"anyOf": [{"const": 1}, {"type": "string"}]}, INF),
])
def test_admitted_outcomes_of_leaves_and_unions(schema, count):
    assert admitted_outcomes(schema) == count


def test_arrays_sum_their_lengths_and_unbounded_arrays_are_infinite():
    two = {"enum": ["x", "y"]}
    assert admitted_outcomes({"type": "array", "items": two, "minItems": 1, "maxItems": 3}) == 2 + 4 + 8
    assert admitted_outcomes({"type": "array", "items": two, "maxItems": 2}) == 1 + 2 + 4
    assert admitted_outcomes({"type": "array", "items": two}) == INF
    assert admitted_outcomes({"type": "array", "items": False}) == 1  # only []
    assert admitted_outcomes({"type": "array", "items": {"type": "string"}, "maxItems": 0}) == 1
    assert admitted_outcomes({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}) == INF
    # prefixItems: position i has its own choices; nothing after the prefix
    fixed = {"type": "array", "prefixItems": [two, {"const": 0}], "items": False, "minItems": 1, "maxItems": 2}
    assert admitted_outcomes(fixed) == 2 + 2 * 1
    unbounded_prefix = {"type": "array", "prefixItems": [two], "items": False}
    assert admitted_outcomes(unbounded_prefix) == 1 + 2


def test_objects_multiply_properties_and_optional_ones_may_be_absent():
    obj = {"type": "object", "properties": {"flag": {"type": "boolean"}, "mode": {"enum": ["on", "off", "auto"]}},
           "required": ["mode"], "additionalProperties": False}
    assert admitted_outcomes(obj) == (2 + 1) * 3
    assert admitted_outcomes({**obj, "required": ["mode", "flag"]}) == 2 * 3
    assert admitted_outcomes({**obj, "required": ["mode", "missing"]}) == 0
    assert admitted_outcomes({**obj, "properties": {**obj["properties"], "note": {"type": "string"}}}) == INF
    # an impossible required property makes the object impossible, even next to a free one
    assert admitted_outcomes({"type": "object", "properties": {"a": False, "b": {"type": "string"}},
                              "required": ["a", "b"], "additionalProperties": False}) == 0


def test_objects_without_additional_properties_follow_the_grammars_strict_reading():
    loose = {"type": "object", "properties": {"k": {"const": 1}}, "required": ["k"]}
    assert admitted_outcomes(loose) == 1
    assert admitted_outcomes(loose, strict=False) == INF
    assert admitted_outcomes({**loose, "additionalProperties": True}) == INF


def test_local_references_are_followed_and_cycles_are_infinite():
    schema = {"$defs": {"Color": {"enum": ["red", "green"]}}, "type": "object",
              "properties": {"c": {"$ref": "#/$defs/Color"}}, "required": ["c"], "additionalProperties": False}
    assert admitted_outcomes(schema) == 2
    cyclic = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}},
                                 "additionalProperties": False}}, "$ref": "#/$defs/Node"}
    assert admitted_outcomes(cyclic) == INF


def test_a_tool_call_constraint_counts_calls_and_the_text_branch():
    call = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": "dim_lights"},
                           "arguments": {"type": "object", "additionalProperties": False, "required": ["room"],
                                         "properties": {"room": {"enum": ["den", "attic"]}}}}}
    calls = {"type": "array", "items": call, "minItems": 1, "maxItems": 2}
    assert admitted_outcomes(calls) == 2 + 4
    forced_one = {"type": "array", "items": {**call, "properties": {**call["properties"], "arguments": {
        "type": "object", "additionalProperties": False, "required": ["room"], "properties": {"room": {"const": "den"}}}}},
        "minItems": 1, "maxItems": 1}
    assert admitted_outcomes(forced_one) == 1
    text = {"type": "object", "properties": {"content": {"type": "string", "maxLength": 80}}, "required": ["content"],
            "additionalProperties": False}
    assert admitted_outcomes({"anyOf": [forced_one, text]}) == INF


# ---------------------------------------------------------------------------------------------
# composition check
# ---------------------------------------------------------------------------------------------

TALK = [{"role": "user", "content": "Ask  the Plumber whether he can come on Tuesday to fix the boiler"}]


@pytest.mark.parametrize(("value", "composed"), [
    ("Could you come on Tuesday to repair our boiler?", True),
    ("ask the plumber whether he can come", False),  # a span, case and spacing aside
    ("ASK THE   PLUMBER whether he can come.", False),  # trailing punctuation does not make it new
    ("Boiler repair", False),  # two words are a label, not a composition
    ("", False),
    ("   ", False),
    (None, False),
    (42, False),
])
def test_is_composition_in_english(value, composed):
    assert is_composition(value, conversation_text(TALK)) is composed


def test_is_composition_counts_cjk_characters_and_reads_tool_results_and_earlier_calls():
    talk = [{"role": "user", "content": "请通知小组明早九点在三楼开周会"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"three words here\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "room seven is booked all day"}]
    text = conversation_text(talk)
    assert is_composition("各位同事，周会改在明天上午九点三楼举行。", text)
    assert not is_composition("明早九点在三楼开周会", text)  # a span of the request
    assert not is_composition("周会三楼", text)  # under 6 CJK characters
    assert not is_composition("Room seven is booked all day", text)  # a span of a tool result
    assert not is_composition("three words here", text)  # a span of an earlier call's arguments


# ---------------------------------------------------------------------------------------------
# scoring: composed fields, date-times, nested defaults, wrong side-effecting calls
# ---------------------------------------------------------------------------------------------

NOTE = ToolSpec.from_openai({"name": "post_note", "description": "Post a note to a board.", "parameters": {
    "type": "object", "required": ["board", "text"], "properties": {
        "board": {"type": "string", "enum": ["ops", "sales"], "x-aliases": {"operations": "ops"}},
        "text": {"type": "string", "minLength": 1}}}}).model_copy(update={"side_effects": True})
REMIND = ToolSpec.from_openai({"name": "remind", "parameters": {
    "type": "object", "required": ["at"], "properties": {"at": {"type": "string", "format": "date-time"}}}})
BASKET = ToolSpec.from_openai({"name": "fill_basket", "parameters": {
    "type": "object", "required": ["lines"], "$defs": {"Line": {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string"}, "count": {"type": "integer", "default": 1}}}},
    "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}}}}}).model_copy(update={"side_effects": True})
LOOKUP = ToolSpec.from_openai({"name": "lookup", "parameters": {
    "type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}})
SPECS = {s.name: s for s in (NOTE, REMIND, BASKET, LOOKUP)}


def _case(expected, *, composed=(), content="Tell the ops board that the east loading dock reopens at noon", tags=()):
    return Case(id="inv-01-en", group="inv-01", toolset="invented", lang="en", split="unseen",
                messages=[{"role": "user", "content": content}], expected_calls=expected, tags=tuple(tags),
                composed=tuple(composed))


def _note(board, text):
    return {"name": "post_note", "arguments": {"board": board, "text": text}}


def test_composed_fields_are_not_compared_for_equality_but_checked_for_composition():
    case = _case([_note("ops", "The east loading dock opens again at 12:00 today.")], composed=[("post_note", "text")])
    written = score_row(case, [_note("ops", "Heads-up: from noon the east dock is open again.")], specs=SPECS)
    assert written.exact and written.compositions == [True] and written.wrong_side_effect_calls == 0
    copied = score_row(case, [_note("ops", "the east loading dock reopens at noon")], specs=SPECS)
    # judged by the composition check instead of equality: a copied span is not exact, but not a wrong call either
    assert not copied.exact and copied.compositions == [False] and copied.wrong_side_effect_calls == 0
    wrong_board = score_row(case, [_note("sales", "Heads-up: from noon the east dock is open again.")], specs=SPECS)
    assert not wrong_board.exact and wrong_board.wrong_side_effect_calls == 1
    not_called = score_row(case, [], specs=SPECS)
    assert not_called.compositions == [False] and not_called.missed_calls == 1
    assert summarize([written, copied, not_called])["compositions"] == [1, 3]


def test_without_a_composed_entry_free_text_must_match():
    case = _case([_note("ops", "dock open")])
    assert score_row(case, [_note("ops", " dock open ")], specs=SPECS).exact
    assert not score_row(case, [_note("ops", "dock reopened")], specs=SPECS).exact


def test_date_times_compare_as_instants_and_a_missing_offset_is_a_different_value():
    case = _case([{"name": "remind", "arguments": {"at": "2031-07-04T09:15:00Z"}}])
    for same in ("2031-07-04T09:15:00+00:00", "2031-07-04T17:15:00+08:00", "2031-07-04T09:15:00.000Z"):
        assert score_row(case, [{"name": "remind", "arguments": {"at": same}}], specs=SPECS).exact, same
    for other in ("2031-07-04T09:15:00", "2031-07-04T09:15:00+01:00", "July 4 2031 9:15"):
        assert not score_row(case, [{"name": "remind", "arguments": {"at": other}}], specs=SPECS).exact, other


@pytest.mark.parametrize(("value", "valid"), [
    ("2031-07-04T09:15:00Z", True),
    ("2031-07-04t09:15:00.25+05:30", True),
    ("2031-07-04T09:15:00", False),  # no offset: the grammar's date-time needs one
    ("2031-07-04T09:15", False),
    ("2031-02-30T09:15:00Z", False),  # not a day
    ("next friday", False),
])
def test_formats_are_part_of_validity(value, valid):
    assert (not validation_errors(REMIND, {"at": value})) is valid


def test_nested_defaults_are_filled_through_references():
    assert canonical_arguments(BASKET, {"lines": [{"code": "Q-1"}, {"code": "Q-2", "count": 3.0}]}) == {
        "lines": [{"code": "Q-1", "count": 1}, {"code": "Q-2", "count": 3}]}


def test_wrong_side_effecting_calls_count_executed_calls_matching_no_expected_call():
    basket = {"name": "fill_basket", "arguments": {"lines": [{"code": "Q-1", "count": 2}]}}
    case = _case([basket, {"name": "lookup", "arguments": {"q": "hours"}}])
    repeated = score_row(case, [basket, basket, {"name": "lookup", "arguments": {"q": "other"}}], specs=SPECS)
    # the second basket matches nothing left; a wrong read-only lookup is a wrong call but no side effect
    assert repeated.wrong_side_effect_calls == 1
    unasked = score_row(_case([]), [_note("ops", "x"), {"name": "lookup", "arguments": {"q": "y"}}], specs=SPECS)
    assert unasked.wrong_side_effect_calls == 1 and unasked.wrong_calls == 2
    assert summarize([repeated, unasked])["wrong_side_effect_calls"] == 2


# ---------------------------------------------------------------------------------------------
# running: decide_checked, plan
# ---------------------------------------------------------------------------------------------


@dataclass
class _Checked:
    status: str
    calls: list = field(default_factory=list)
    attempts: list = field(default_factory=list)
    request_id: str | None = None


@dataclass
class _Plan:
    grammar_json: str | None


class _CheckedDecider:
    """Proposes an unasked note; its check sends it to review, so nothing runs."""

    def __init__(self, status):
        self.status = status
        self.plain_calls = 0

    def plan(self, request: DecideRequest) -> _Plan:
        return _Plan(json.dumps({"type": "array", "items": {"enum": [1, 2]}, "minItems": 1, "maxItems": 1}))

    def decide(self, request: DecideRequest) -> Decision:
        self.plain_calls += 1
        raise AssertionError("decide_checked is preferred")

    def decide_checked(self, request: DecideRequest) -> _Checked:
        proposal = ToolCall(id="c0", index=0, name="post_note", arguments={"board": "ops", "text": "unasked"})
        runs = [proposal] if self.status == "calls" else []
        return _Checked(status=self.status, calls=runs, attempts=[object(), object()], request_id=request.request_id)


class _PlainDecider:
    def decide(self, request: DecideRequest) -> Decision:
        return Decision(request_id=request.request_id, raw_output="[]",
                        tool_calls=[ToolCall(id="c0", index=0, name="post_note", arguments={"board": "ops", "text": "x"})])


@pytest.fixture
def invented_toolset(monkeypatch):
    monkeypatch.setattr(quality, "load_toolset", lambda name: list(SPECS.values()))
    monkeypatch.setattr(quality_scoring, "spec_map", lambda name: dict(SPECS))


def test_needs_review_executes_nothing_and_is_counted(invented_toolset):
    case = _case([])
    [held] = run_cases(_CheckedDecider("needs_review"), [case])
    assert held.status == "needs_review" and held.attempts == 2 and held.predicted == []
    assert held.exact and held.wrong_side_effect_calls == 0 and held.admitted == 2
    [ran] = run_cases(_CheckedDecider("calls"), [case])
    assert ran.wrong_side_effect_calls == 1 and not ran.exact
    s = summarize([held, ran])
    assert s["needs_review"] == 1 and s["wrong_side_effect_calls"] == 1 and s["admitted_one"] == 0.0


def test_failed_decisions_run_nothing_and_call_objects_with_name_and_arguments_are_read(invented_toolset):
    @dataclass
    class Checked:  # the shape of a checked call: name and arguments, neither ToolCall nor mapping
        index: int
        name: str
        arguments: dict

    class Decider:
        def __init__(self, status):
            self.status = status

        def decide_checked(self, request):
            return _Checked(status=self.status, calls=[Checked(0, "post_note", {"board": "sales", "text": "z"})],
                            request_id=request.request_id)

    [failed] = run_cases(Decider("failed"), [_case([])])
    assert failed.status == "failed" and failed.predicted == [] and failed.wrong_side_effect_calls == 0
    assert summarize([failed])["failed"] == 1
    [ran] = run_cases(Decider("calls"), [_case([])])
    assert ran.predicted == [{"name": "post_note", "arguments": {"board": "sales", "text": "z"}}]
    assert ran.wrong_side_effect_calls == 1


def test_a_decider_without_plan_or_decide_checked_reports_n_a_and_counts_every_returned_call(invented_toolset):
    [row] = run_cases(_PlainDecider(), [_case([])])
    assert row.admitted is None and row.status is None and row.wrong_side_effect_calls == 1
    s = summarize([row])
    assert s["admitted_rows"] == 0 and s["admitted_one"] is None
    assert "n/a" in markdown_table({"x": s}) and "one outcome n/a" in headline(s)


def test_the_share_of_rows_admitting_one_outcome(invented_toolset):
    class OneWay(_PlainDecider):
        def plan(self, request):
            return _Plan(json.dumps({"const": [{"name": "lookup", "arguments": {"q": "z"}}]}))

    class Open(_PlainDecider):
        def plan(self, request):
            return _Plan(json.dumps({"type": "object", "properties": {"content": {"type": "string"}}}))

    rows = run_cases(OneWay(), [_case([])]) + run_cases(Open(), [_case([])]) * 3
    assert [r.admitted for r in rows] == [1, "inf", "inf", "inf"]
    assert summarize(rows)["admitted_one"] == pytest.approx(0.25)
