"""Decision-quality mechanisms: typed candidates, role cues, the call count, text caps, repeats.

The tools here are invented for the tests (a parcel desk, a clinic), so nothing is fitted to
the benchmark's tool sets: every mechanism is read from the specs' types, patterns and cues.
Only the last test plans on a (tiny, random) engine; none needs the real model.
"""

from __future__ import annotations

import json

from decider_fixtures import tiny_decider, tiny_engine  # noqa: F401

from decider.grounding import call_count, collect_evidence, ground_tools, is_name_like, tool_cues, typed_spans
from decider.schema import tool_calls_schema
from decider.service import TECHNIQUES, DeciderConfig, _without_repeats
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


def test_role_words_of_field_names_pick_the_span_they_introduce():
    tools = [fn("pay", {"from_account": {"type": "string"}, "to": {"type": "string"}, "amount": {"type": "number"}},
                ["from_account", "to", "amount"])]
    props = narrowed(tools, "pay 40 from account 4410-2231 to Li Na").parameters["pay"]["properties"]
    assert props["from_account"]["enum"] == ["4410-2231"] and props["to"]["enum"] == ["Li Na"]
    props = narrowed(tools, "从储蓄账户转 500 元给李娜").parameters["pay"]["properties"]
    assert props["from_account"]["enum"] == ["储蓄账户"] and props["to"]["enum"] == ["李娜"]


def test_a_value_a_shaped_sibling_takes_is_no_name():
    tools = [fn("ship", {"name": {"type": "string"}, "phone": {"type": "string", "pattern": r"^\d{7,15}$"}},
                ["name", "phone"])]
    props = narrowed(tools, "ship to Ada Byron, 13900001111").parameters["ship"]["properties"]
    assert props["phone"]["enum"] == ["13900001111"] and "13900001111" not in props["name"]["enum"]


def test_a_bare_value_after_a_conjunction_repeats_the_action():
    tools = [fn("forecast", {"city": {"type": "string"}, "day": {"type": "string", "enum": ["today", "tomorrow"]}},
                ["city", "day"]), fn("note", {"person": {"type": "string"}}, ["person"])]
    result = count("forecast for today in London and Madrid", tools)
    assert result.upper == 2 and all("forecast" in slot for slot in result.slots)


def test_plan_fixes_the_count_and_narrows_each_call(tiny_decider):  # noqa: F811
    from decider.protocol import DecideRequest

    request = DecideRequest(request_id="qm-1", messages=user("Where are P10001 and P10002?"), tools=clinic_tools())
    plan = tiny_decider.plan(request)
    schema = json.loads(plan.grammar_json)
    calls = schema if "prefixItems" in schema else next(o for o in schema["anyOf"] if "prefixItems" in o)
    assert plan.call_count == (2, 2) and calls["minItems"] == calls["maxItems"] == 2
    assert "P10001" in json.dumps(calls["prefixItems"][0]) and "P10001" not in json.dumps(calls["prefixItems"][1])
    explicit = tiny_decider.plan(request.model_copy(update={"max_calls": 3}))
    assert explicit.call_count is None  # the caller's max_calls is the caller's decision


def test_a_tool_is_shadowed_by_a_dropped_tool_that_explains_more_of_the_request():
    tools = [fn("track", {"parcel": {"type": "string", "pattern": r"^P\d{5}$"}}, ["parcel"]),
             fn("claim", {"parcel": {"type": "string", "pattern": r"^P\d{5}$"},
                          "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                          "why": {"type": "string", "enum": ["lost", "broken"], "x-enum-aliases": {"broken": ["坏了"]}}},
                  ["parcel", "amount", "why"])]
    shadowed = ground_tools(tools, user("P10001 坏了，赔我"), ground_all=True)
    assert shadowed.parameters == {} and "track" in shadowed.dropped  # a claim without an amount: ask, don't track
    assert "track" in ground_tools(tools, user("P10001 到哪了"), ground_all=True).parameters
    assert "track" in ground_tools(tools, user("P10001 坏了，赔 30 元"), ground_all=True).parameters


def cued(name, properties, required, cues):
    spec = fn(name, properties, required)
    return spec.model_copy(update={"parameters": {**spec.parameters, "x-cues": cues}})


def test_a_word_shifted_by_the_word_before_it_is_no_evidence_of_itself():
    evidence = collect_evidence(user("the day after tomorrow, not damaged, 300元 or 日元, 南京"))
    assert not evidence.mentions("tomorrow") and not evidence.mentions("damaged")
    assert evidence.mentions("元")  # after a digit
    assert not evidence.mentions("京")  # the tail of 南京, not the alias of 北京
    assert collect_evidence(user("明天 tomorrow")).mentions("tomorrow")
    assert collect_evidence(user("三百元")).mentions("元")


def test_tool_cues_are_declared_words_and_the_words_only_its_name_has():
    tools = [cued("track_parcel", {"parcel": {"type": "string"}}, ["parcel"], ["物流", "where"]),
             fn("claim_parcel", {"parcel": {"type": "string"}}, ["parcel"]),
             fn("get_note", {"person": {"type": "string"}}, ["person"])]
    cues = tool_cues(tools)
    assert cues["track_parcel"] == ("物流", "where", "track")  # "parcel" is shared, "get" says nothing
    assert cues["claim_parcel"] == ("claim",) and cues["get_note"] == ("note",)


def test_a_named_tool_that_lacks_a_value_shadows_a_tool_with_only_free_text():
    tools = [fn("send_money", {"to": {"type": "string"}, "amount": {"type": "number", "exclusiveMinimum": 0}},
                ["to", "amount"]),
             fn("note", {"person": {"type": "string"}}, ["person"])]
    result = ground_tools(tools, user("send money to Charlie"), ground_all=True)
    assert result.parameters == {} and "note" in result.dropped  # ask for the amount, don't note Charlie
    assert "note" in ground_tools(tools, user("note Charlie"), ground_all=True).parameters


def test_a_quantity_no_numeric_field_accepts_makes_no_call():
    tools = [fn("reserve", {"day": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                            "minutes": {"type": "integer", "minimum": 15, "maximum": 120, "default": 30}}, ["day"])]
    result = narrowed(tools, "reserve 2026-03-04 for 300 minutes")
    assert "reserve" in result.dropped and "300" in result.dropped["reserve"]  # not the default 30 instead
    assert narrowed(tools, "reserve 2026-03-04 for 90 minutes").parameters["reserve"]["properties"]["minutes"]["enum"] == [90]
    assert "reserve" in narrowed(tools, "reserve 2026-03-04").parameters


def test_a_tool_declaring_cues_must_be_named_when_its_evidence_fits_another_tool_alike():
    tools = [cued("track", {"parcel": {"type": "string", "pattern": r"^P\d{5}$"}}, ["parcel"], ["到哪", "where"]),
             fn("claim", {"parcel": {"type": "string", "pattern": r"^P\d{5}$"},
                          "amount": {"type": "number", "exclusiveMinimum": 0}}, ["parcel", "amount"])]
    assert ground_tools(tools, user("cancel P10001"), ground_all=True).parameters == {}
    assert "track" in ground_tools(tools, user("P10001 到哪了"), ground_all=True).parameters
    assert "track" in ground_tools(tools, user("where is P10001?"), ground_all=True).parameters


def test_a_cjk_label_before_an_identifier_gives_the_identifier():
    tools = [fn("pay", {"from_account": {"type": "string"}, "to": {"type": "string"}, "amount": {"type": "number"}},
                ["from_account", "to", "amount"])]
    props = narrowed(tools, "从账户 6222021001 向 6222029876 付 1200").parameters["pay"]["properties"]
    assert props["from_account"]["enum"] == ["6222021001"]
    spans = collect_evidence(user("另外查下工资卡")).spans
    assert "工资卡" in spans and not any(s.startswith(("下", "另外")) for s in spans)


def test_numbers_in_words_clock_times_and_durations_are_evidence():
    from decider.grounding import clock_times, parse_chinese_number, parse_english_number

    assert parse_chinese_number("两千五") == 2500 and parse_chinese_number("一千零五") == 1005
    assert parse_english_number("two thousand five hundred") == 2500 and parse_english_number("twelve") == 12
    assert parse_english_number("one") is None  # "one account to another" counts nothing
    assert clock_times("下午3点，8个人") == ["15:00"] and clock_times("at 3 pm") == ["15:00"]
    assert clock_times("下午两点半") == ["14:30"]
    tools = [fn("reserve", {"at": {"type": "string", "pattern": r"^([01]\d|2[0-3]):[0-5]\d$"},
                            "people": {"type": "integer", "minimum": 1, "maximum": 20},
                            "minutes": {"type": "integer", "minimum": 15, "maximum": 240, "default": 60}},
                ["at", "people"])]
    props = narrowed(tools, "reserve at 3 pm, twelve of us, for two hours").parameters["reserve"]["properties"]
    assert props["at"]["enum"] == ["15:00"] and 12 in props["people"]["enum"] and props["minutes"]["enum"] == [120]
    assert 3 not in props["people"]["enum"]  # the 3 of "3 pm" is a time, not a count


def test_a_list_makes_one_call_per_item():
    tools = [fn("balance", {"who": {"type": "string"}}, ["who"])]
    assert count("balances for Zhang Wei, Li Xiuying and Ouyang Nana", tools).upper == 3
    assert count("查一下张伟、李秀英和欧阳娜娜的余额", tools).upper == 3
    forecast = [fn("forecast", {"city": {"type": "string"}, "day": {"type": "string", "enum": ["today", "tomorrow"]}},
                   ["city", "day"])]
    assert count("Which is hotter today, Paris or Berlin?", forecast).upper == 2  # a question, then a list of two


def test_scored_count_keeps_the_likeliest_call_set(tiny_engine):  # noqa: F811
    import asyncio

    from decider.protocol import DecideRequest
    from decider.service import EmbeddedDecider

    decider = EmbeddedDecider.from_engine(tiny_engine, config=DeciderConfig(**TECHNIQUES["scored-count"]))
    request = DecideRequest(request_id="qm-score", messages=user("note for Anna and Bob"), tools=clinic_tools())
    plan = decider.plan(request)
    assert plan.call_count == (1, 2)
    candidates = {k: asyncio.run(decider.arun(decider.plan(request, calls=k))) for k in (1, 2)}
    assert all(d.logprob is not None and d.logprob < 0 for d in candidates.values())
    decision = decider.decide(request)
    best = max(candidates, key=lambda k: candidates[k].logprob)
    assert len(decision.tool_calls) == best and decision.usage["count_candidates"] == 2
    assert abs(decision.logprob - candidates[best].logprob) < 1e-3
    assert decision.request_id == "qm-score" and all(c.id.startswith("call_qm-score_") for c in decision.tool_calls)
