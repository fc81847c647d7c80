"""Decision-quality mechanisms that need no model: typed candidates, the call count, text caps, repeats.

The tools here are invented for the tests (a parcel desk, a clinic), so nothing is fitted to
the benchmark's tool sets: every mechanism is read from the specs' types, patterns and cues.
"""

from __future__ import annotations

from decider.grounding import call_count, collect_evidence, ground_tools, is_name_like, typed_spans
from decider.schema import tool_calls_schema
from decider.service import DeciderConfig, TECHNIQUES, _without_repeats
from tools.calls import ToolCall
from tools.spec import ToolSpec


def user(text):
    return [{"role": "user", "content": text}]


def fn(name, properties, required, description=""):
    return ToolSpec.from_openai({"name": name, "description": description,
                                 "parameters": {"type": "object", "properties": properties, "required": required}})


def clinic_tools():
    return [
        fn("book_visit", {
            "day": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "at": {"type": "string", "format": "time"},
            "patients": {"type": "integer", "minimum": 1, "maximum": 6},
            "doctor": {"type": "string", "enum": ["lee", "khan"], "x-enum-aliases": {"lee": ["Dr Lee", "李医生"],
                                                                                       "khan": ["Dr Khan", "汗医生"]}},
        }, ["day", "at", "patients", "doctor"]),
        fn("cancel_visit", {"ticket": {"type": "string", "pattern": r"^TK-\d{3}$"}}, ["ticket"]),
        fn("track_parcel", {"parcel": {"type": "string", "pattern": r"^P\d{5}$"}}, ["parcel"]),
        fn("note", {"person": {"type": "string", "maxLength": 30}}, ["person"]),
    ]


def narrowed(tools, text):
    return ground_tools(tools, user(text), ground_all=True)


def test_shaped_fields_take_spans_of_their_shape_and_numbers_never_come_from_inside_them():
    result = narrowed(clinic_tools(), "Dr Lee on 2026-03-04 at 08:15 for 2 patients")
    visit = result.parameters["book_visit"]["properties"]
    assert visit["day"]["enum"] == ["2026-03-04"]
    assert visit["at"]["enum"] == ["08:15"]
    assert visit["patients"]["enum"] == [2]  # not 3, 4 or 15 from the date and time
    assert set(collect_evidence(user("2026-03-04 08:15 TK-123")).numbers) == set()


def test_shaped_match_never_starts_or_ends_inside_a_word():
    assert typed_spans({"pattern": r"^TK-\d{3}$"}, "TK-1234 and TK-123") == ["TK-123"]
    assert typed_spans({"type": "string"}, "anything") is None
    assert "cancel_visit" in narrowed(clinic_tools(), "cancel TK-12").dropped


def test_names_are_never_quantities_or_dates():
    assert not is_name_like("500") and not is_name_like("88.8") and not is_name_like("2026-03-04")
    assert is_name_like("6222021001") and is_name_like("4410-2231") and is_name_like("Li Na")
    person = narrowed(clinic_tools(), "note 300 for Anna").parameters["note"]["properties"]["person"]["enum"]
    assert "Anna" in person and "300" not in person
    spans = collect_evidence(user("move it from checking to Bob")).spans
    assert "checking to Bob" not in spans and "Bob" in spans


def test_chinese_request_words_are_boundaries():
    person = narrowed(clinic_tools(), "余额查询：记一下王芳").parameters["note"]["properties"]["person"]["enum"]
    assert "王芳" in person and "余额" not in person


def count(text, tools=None):
    tools = tools or clinic_tools()
    result = ground_tools(tools, user(text), ground_all=True)
    offered = [t for t in tools if t.name in result.parameters]
    return call_count(offered, result.parameters, user(text))


def test_one_call_per_distinct_evidence_set():
    one = count("Dr Lee on 2026-03-04 at 08:15, 2 patients, please")
    assert (one.lower, one.upper) == (1, 1)
    three = count("Where are P10001, P10002 and P10003?")
    assert (three.lower, three.upper) == (3, 3)
    mixed = count("取消 TK-123，另外 P10001 到哪了")
    assert mixed.upper == 2
    two_visits = count("汗医生 2026-03-04 08:15 两人，再约李医生 2026-03-05 09:00 1 人")
    assert two_visits.upper == 2


def test_free_text_after_a_comma_stays_in_its_call():
    assert count("note for Anna, please").upper == 1
    assert count("note for Anna and Bob").upper == 2  # a conjunction after a complete call


def test_text_answer_is_capped():
    schema = tool_calls_schema([], allow_text=True, text_max_chars=80)
    assert schema["properties"]["content"]["maxLength"] == 80


def test_exact_repeats_dropped_first_kept():
    calls = [ToolCall(id=f"c{i}", index=i, name="note", arguments=args)
             for i, args in enumerate([{"person": "A"}, {"person": "A"}, {"person": "B"}])]
    assert [c.index for c in _without_repeats(calls)] == [0, 2]


def test_techniques_are_config_overrides():
    for overrides in TECHNIQUES.values():
        DeciderConfig(**overrides)
    assert DeciderConfig().count_calls and DeciderConfig().ground_all
