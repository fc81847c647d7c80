"""The unseen split is well-formed: agent-style tool sets, rows that fit their schemas (no model)."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a plain directory, not an installed package
    sys.path.insert(0, str(ROOT))

from bench.quality_cases import DATA_DIR, load_cases  # noqa: E402
from bench.quality_schema import canonical_arguments, validation_errors  # noqa: E402
from bench.quality_scoring import conversation_text, is_composition  # noqa: E402
from bench.toolsets import UNSEEN_TOOLSETS, load_toolset, spec_map  # noqa: E402

UNSEEN = load_cases(split="unseen")
CJK = re.compile(r"[\u4e00-\u9fff]")
SIDE_EFFECTING = {"send_email", "create_event", "restart_service", "create_ticket", "place_order", "cancel_order"}


def _walk(schema, root, value, path=""):
    """Yield ``(path, schema, value)`` for every value under ``schema`` (local $refs followed)."""
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    branches = [b for b in schema.get("anyOf", ()) if b.get("type") != "null"]
    if branches and value is not None:
        schema = branches[0]
    yield path, schema, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(schema.get("properties", {}).get(key, {}), root, item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(schema.get("items", {}), root, item, f"{path}/{index}")


def _schema_errors(spec, arguments):
    """JSON Schema errors, formats included (the harness's own check: ``date-time`` needs an offset)."""
    return validation_errors(spec, arguments)


def _earlier_calls(case):
    for message in case.messages:
        yield from message.get("tool_calls") or ()


# ---------------------------------------------------------------------------------------------
# the tool sets
# ---------------------------------------------------------------------------------------------


def test_at_least_four_agent_style_tool_sets_with_side_effects_marked():
    assert len(UNSEEN_TOOLSETS) >= 4
    names = {spec.name: spec for toolset in UNSEEN_TOOLSETS for spec in load_toolset(toolset)}
    assert {name for name, spec in names.items() if spec.side_effects} == SIDE_EFFECTING
    for spec in names.values():
        assert spec.parameters["additionalProperties"] is False, spec.name
        assert spec.description, spec.name


def test_unseen_tool_sets_declare_schema_and_grounding_only_no_decider_cues():
    for toolset in UNSEEN_TOOLSETS:
        for spec in load_toolset(toolset):
            text = json.dumps(spec.parameters)
            assert "x-cues" not in text and "x-enum-aliases" not in text, spec.name


def test_side_effecting_tools_mark_grounded_fields_and_aliases_name_enum_members():
    for toolset in UNSEEN_TOOLSETS:
        for spec in load_toolset(toolset):
            schema = json.dumps(spec.parameters)
            if spec.side_effects and spec.name not in {"restart_service", "create_ticket"}:  # all-enum / free text
                assert '"x-grounded": true' in schema, spec.name
            for name, prop in spec.parameters["properties"].items():
                aliases = prop.get("x-aliases")
                if aliases:
                    assert set(aliases.values()) <= set(prop["enum"]), (spec.name, name)


def test_the_shapes_agent_builders_register_are_there():
    email = spec_map("email")["send_email"].parameters["properties"]
    assert email["to"]["type"] == "array" and email["to"]["items"]["format"] == "email"
    event = spec_map("agenda")["create_event"].parameters["properties"]
    assert event["start"]["format"] == "date-time" and event["attendees"]["items"]["format"] == "email"
    search = spec_map("search")
    assert search["get_stock_quote"].parameters["properties"]["ticker"]["pattern"] == "^[A-Z]{1,5}$"
    assert search["convert_currency"].parameters["properties"]["from"]["x-aliases"]["欧元"] == "EUR"
    bounds = search["web_search"].parameters["properties"]["max_results"]
    assert (bounds["minimum"], bounds["maximum"]) == (1, 10)
    restart = spec_map("devops")["restart_service"].parameters["properties"]
    assert restart["force"] == {**restart["force"], "type": "boolean", "default": False}
    order = spec_map("commerce")["place_order"].parameters
    line = order["$defs"]["OrderLine"]
    assert order["properties"]["items"]["items"]["$ref"] == "#/$defs/OrderLine" and line["properties"]["quantity"]["minimum"] == 1


# ---------------------------------------------------------------------------------------------
# the rows
# ---------------------------------------------------------------------------------------------


def test_at_least_60_rows_about_three_quarters_english_over_every_unseen_tool_set():
    assert len(UNSEEN) >= 60
    langs = Counter(c.lang for c in UNSEEN)
    assert 0.70 <= langs["en"] / len(UNSEEN) <= 0.80, langs
    toolsets = Counter(c.toolset for c in UNSEEN)
    assert set(toolsets) == set(UNSEEN_TOOLSETS) and min(toolsets.values()) >= 10, toolsets
    for path in DATA_DIR.glob("unseen_*.jsonl"):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert {r["split"] for r in rows} == {"unseen"} and {r["toolset"] for r in rows} == {path.stem.removeprefix("unseen_")}


def test_user_turns_are_in_the_rows_language():
    for case in UNSEEN:
        user_text = " ".join(m["content"] for m in case.messages if m["role"] == "user")
        assert user_text.strip(), case.id
        assert bool(CJK.search(user_text)) == (case.lang == "zh"), case.id


def test_every_expected_and_earlier_call_validates_against_its_tool_schema():
    for case in UNSEEN:
        specs = spec_map(case.toolset)
        for call in case.expected_calls:
            assert set(call) == {"name", "arguments"} and call["name"] in specs, case.id
            assert not _schema_errors(specs[call["name"]], call["arguments"]), (case.id, call)
        for call in _earlier_calls(case):
            function = call["function"]
            assert not _schema_errors(specs[function["name"]], json.loads(function["arguments"])), (case.id, call)


def test_follow_up_rows_are_a_call_its_result_then_the_next_step():
    follow_ups = [c for c in UNSEEN if "follow_up" in c.tags]
    assert len(follow_ups) >= 8
    assert sum(not c.expected_calls for c in follow_ups) >= 3 and sum(bool(c.expected_calls) for c in follow_ups) >= 3
    for case in UNSEEN:
        roles = [m["role"] for m in case.messages]
        assert ("tool" in roles) == ("follow_up" in case.tags), case.id
        if "tool" not in roles:
            assert roles[-1] == "user", case.id
            continue
        assert roles[-1] == "tool", case.id
        pending: list[str] = []
        for message in case.messages:
            if message["role"] == "assistant":
                assert not pending and message["tool_calls"], case.id
                pending = [c["id"] for c in message["tool_calls"]]
                assert all(c["type"] == "function" for c in message["tool_calls"]), case.id
            elif message["role"] == "tool":
                assert pending and message["tool_call_id"] == pending.pop(0) and message["content"].strip(), case.id
        assert not pending, case.id


def test_tags_agree_with_the_expected_calls_and_cover_the_hard_cases():
    for case in UNSEEN:
        n = len(case.expected_calls)
        assert ("no_call" in case.tags) == (n == 0), case.id
        assert ("single" in case.tags) == (n == 1), case.id
        assert ("parallel" in case.tags) == (n >= 2), case.id
        assert ("composed" in case.tags) == bool(case.composed), case.id
        if n == 0:
            assert {"missing_required", "unacceptable_value", "no_tool", "chit_chat", "text_answer"} & set(case.tags), case.id
    tags = Counter(t for c in UNSEEN for t in c.tags)
    for tag, at_least in (("single", 20), ("parallel", 5), ("no_call", 12), ("missing_required", 5), ("chit_chat", 2),
                          ("no_tool", 3), ("reshaped", 8), ("composed", 8), ("alias", 5), ("follow_up", 8)):
        assert tags[tag] >= at_least, (tag, tags)
    # a wrong call here would have a side effect: no-call rows sit on every set with side-effecting tools
    for toolset in ("email", "agenda", "devops", "commerce"):
        assert any(not c.expected_calls for c in UNSEEN if c.toolset == toolset), toolset


def test_composed_entries_name_string_fields_of_expected_calls_and_their_references_are_compositions():
    for case in (c for c in UNSEEN if c.composed):
        specs = spec_map(case.toolset)
        conversation = conversation_text(case.messages)
        for tool, field in case.composed:
            prop = specs[tool].parameters["properties"][field]
            assert prop["type"] == "string" and not ({"enum", "pattern", "format"} & set(prop)), (case.id, field)
            values = [c["arguments"][field] for c in case.expected_calls if c["name"] == tool]
            assert values and all(is_composition(v, conversation) for v in values), (case.id, tool, field)


def test_values_written_out_of_shape_map_to_schema_shaped_expectations():
    """Rows tagged ``reshaped`` expect a value the request does not contain in the field's shape."""
    for case in (c for c in UNSEEN if "reshaped" in c.tags):
        specs = spec_map(case.toolset)
        conversation = conversation_text(case.messages)
        shaped = [value for call in case.expected_calls
                  for _, sub, value in _walk(specs[call["name"]].parameters, specs[call["name"]].parameters,
                                             call["arguments"])
                  if isinstance(value, str) and (sub.get("format") == "date-time" or "pattern" in sub)]
        assert shaped and any(value not in conversation for value in shaped), case.id


@pytest.mark.parametrize("toolset", UNSEEN_TOOLSETS)
def test_canonical_arguments_are_stable_on_the_expected_calls(toolset):
    specs = spec_map(toolset)
    for case in (c for c in UNSEEN if c.toolset == toolset):
        for call in case.expected_calls:
            once = canonical_arguments(specs[call["name"]], call["arguments"])
            assert canonical_arguments(specs[call["name"]], once) == once, case.id
