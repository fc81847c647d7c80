"""Declared grounding, the conversation's values, and the language data (invented inputs only)."""

from __future__ import annotations

import pytest

from tools.evidence import ConversationValues, languages, normalize_text, parse_number_words
from tools.grounding import check_grounding, declaration_errors, grounded_paths
from tools.spec import ToolSpec

BOOKING = {
    "type": "object",
    "properties": {
        "venue": {"type": "string", "x-grounded": True},
        "guests": {"type": "integer", "minimum": 1},
        "starts_at": {"type": "string", "format": "date-time"},
        "tier": {"type": "string", "enum": ["basic", "gold"], "x-aliases": {"金卡": "gold"}},
        "note": {"type": "string"},
        "express": {"type": "boolean", "default": False},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^K-[0-9]{3}$"}, "label": {"type": "string"}}}},
    },
}


def values(text: str) -> ConversationValues:
    return ConversationValues.from_messages([{"role": "user", "content": text}])


# ------------------------------------------------------------------ language data


@pytest.mark.parametrize(("text", "lang", "number"), [
    ("three hundred and twelve", "en", 312), ("forty-two", "en", 42), ("two thousand five hundred", "en", 2500),
    ("三百一十二", "zh", 312), ("两千五", "zh", 2500), ("一万零五", "zh", 10005), ("三点五", "zh", 3.5),
    ("banana", "en", None), ("香蕉", "zh", None),
])
def test_number_words_come_from_the_language_files(text, lang, number):
    assert parse_number_words(text, lang) == number


def test_every_language_file_declares_its_style_and_months_are_numbers():
    for code, data in languages().items():
        assert data["style"] in ("words", "characters"), code
        assert all(1 <= month <= 12 for month in data.get("months", {}).values()), code


def test_conversation_numbers_digits_words_and_suffixes():
    found = values("ship 1,250 units, then twelve more; budget 3k and 2万; code Zx9q7 is no number; 给王五转500元")
    assert {1250.0, 12.0, 3000.0, 20000.0, 500.0} <= found.numbers
    assert 9.0 not in found.numbers and 7.0 not in found.numbers
    dated = values("on 2031-02-03 at 10:45")
    assert 2.0 not in dated.numbers and {10.0, 45.0} <= dated.numbers


def test_normalized_text_ignores_case_width_and_cjk_latin_spacing():
    assert normalize_text("Ｈｅｌｌｏ  订 ABC 餐厅") == "hello订abc餐厅"
    assert values("去 Blue Door 餐厅").has_text("blue door")
    assert not values("the categories").has_text("cat")  # Latin words are matched whole


# ------------------------------------------------------------------ which fields are grounded


def test_side_effect_defaults_ground_numbers_and_shaped_strings_not_free_text():
    paths = grounded_paths(BOOKING, side_effects=True)
    assert set(paths) == {"/venue", "/guests", "/starts_at", "/tier", "/items/*/sku"}
    assert set(grounded_paths(BOOKING, side_effects=False)) == {"/venue"}


def test_x_grounded_false_opts_out_and_a_list_opts_in():
    schema = {"type": "object", "x-grounded": ["note"], "properties": {
        "note": {"type": "string"}, "guests": {"type": "integer", "x-grounded": False}}}
    assert set(grounded_paths(schema, side_effects=True)) == {"/note"}


def test_a_listed_field_that_does_not_exist_is_refused_at_registration():
    assert declaration_errors({"type": "object", "x-grounded": ["ghost"], "properties": {}}) == [
        "/ghost: x-grounded names a field that does not exist"]
    with pytest.raises(ValueError, match="/parameters/ghost"):
        ToolSpec(name="t", parameters={"type": "object", "x-grounded": ["ghost"], "properties": {}})


# ------------------------------------------------------------------ the check


def test_supported_values_pass():
    args = {"venue": "Blue Door", "guests": 6, "starts_at": "2031-07-04T19:30:00", "tier": "gold",
            "note": "a window table would be lovely", "express": False, "items": [{"sku": "K-204", "label": "cake"}]}
    text = "Book Blue Door for six people on July 4 2031 at 7:30 pm, 金卡, and add cake K-204"
    assert check_grounding(BOOKING, args, values(text), side_effects=True) == []


def test_unsupported_values_are_named_by_path():
    args = {"venue": "Red Fern", "guests": 8, "tier": "basic", "items": [{"sku": "K-204"}, {"sku": "K-999"}]}
    findings = check_grounding(BOOKING, args, values("table at Blue Door for 6 with K-204"), side_effects=True)
    assert [f["path"] for f in findings] == ["/venue", "/guests", "/tier", "/items/1/sku"]
    assert all(f["validator"] == "grounded" for f in findings)


def test_a_value_equal_to_the_default_needs_no_evidence():
    schema = {"type": "object", "properties": {"size": {"type": "integer", "default": 10}}}
    assert check_grounding(schema, {"size": 10}, values("hi"), side_effects=True) == []
    assert check_grounding(schema, {"size": 11}, values("hi"), side_effects=True)


def test_a_date_is_supported_only_when_every_part_is_stated():
    schema = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}
    stated = values("March 3 2030 at 9am")
    assert check_grounding(schema, {"at": "2030-03-03T09:00:00"}, stated, side_effects=True) == []
    assert check_grounding(schema, {"at": "2030-03-04T09:00:00"}, stated, side_effects=True)
    assert check_grounding(schema, {"at": "2030-03-03T10:00:00"}, stated, side_effects=True)


def test_tool_results_ground_values_but_assistant_words_do_not():
    schema = {"type": "object", "properties": {"ref": {"type": "string", "x-grounded": True}}}
    messages = [{"role": "user", "content": "cancel my latest booking"},
                {"role": "assistant", "content": "maybe BK-1?"},
                {"role": "tool", "content": '{"latest": "BK-77"}'}]
    evidence = ConversationValues.from_messages(messages)
    assert check_grounding(schema, {"ref": "BK-77"}, evidence, side_effects=True) == []
    assert check_grounding(schema, {"ref": "BK-1"}, evidence, side_effects=True)


def test_a_default_never_overrides_another_value_the_user_stated_for_that_field():
    schema = {"type": "object", "properties": {
        "currency": {"type": "string", "enum": ["USD", "EUR"], "default": "USD"},
        "account": {"type": "string", "pattern": "^ACC-[0-9]+$", "default": "ACC-1"},
        "speed": {"type": "string", "enum": ["normal", "express"], "default": "normal"}}}
    call = {"currency": "USD", "account": "ACC-1", "speed": "normal"}
    assert check_grounding(schema, call, values("send it"), side_effects=True) == []
    said_otherwise = values("send 5 euros from ACC-77, express please")
    findings = check_grounding(schema, call, said_otherwise, side_effects=True)
    assert [f["path"] for f in findings] == ["/currency", "/account", "/speed"]
    assert check_grounding(schema, {"currency": "EUR", "account": "ACC-77", "speed": "express"}, said_otherwise,
                           side_effects=True) == []
