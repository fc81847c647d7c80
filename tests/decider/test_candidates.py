"""Typed candidates, platform bounds and loop cuts (invented tools and requests)."""

from __future__ import annotations

from decider.candidates import narrow_tools
from decider.schema import bound_free_text
from decider.service import _loop_period
from tools.spec import ToolSpec

SHIP = ToolSpec(name="ship_parcel", side_effects=True, parameters={
    "type": "object", "additionalProperties": False, "required": ["parcel", "weight_kg", "speed"],
    "properties": {
        "parcel": {"type": "string", "pattern": "^PX[0-9]{5}$"},
        "weight_kg": {"type": "number", "exclusiveMinimum": 0, "maximum": 30},
        "speed": {"type": "string", "enum": ["standard", "express"], "x-aliases": {"加急": "express", "rush": "express"}},
        "pickup": {"type": "string", "format": "date"},
        "message": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    }})
LOOKUP = ToolSpec(name="lookup_parcel", parameters={
    "type": "object", "additionalProperties": False, "required": ["parcel"],
    "properties": {"parcel": {"type": "string", "pattern": "^PX[0-9]{5}$"}}})


def narrow(text: str):
    return narrow_tools([SHIP, LOOKUP], [{"role": "user", "content": text}])


def test_shaped_enum_and_number_fields_take_the_conversations_values():
    result = narrow("rush PX12345 (4.5 kg) on 2031-02-03, not PX1234 or XPX99999")
    assert result.narrowed["ship_parcel"] == {"/parcel": ["PX12345"], "/weight_kg": [4.5], "/speed": ["express"],
                                              "/pickup": ["2031-02-03"]}
    assert result.parameters["ship_parcel"]["properties"]["parcel"]["enum"] == ["PX12345"]


def test_free_text_arrays_of_free_text_and_fields_without_candidates_stay_open():
    result = narrow("ship PX12345 please, say happy birthday")
    props = result.parameters["ship_parcel"]["properties"]
    assert props["message"] == SHIP.parameters["properties"]["message"]
    assert props["tags"] == SHIP.parameters["properties"]["tags"]
    assert "enum" not in props["speed"] or props["speed"]["enum"] == ["standard", "express"]
    assert "/weight_kg" not in result.narrowed["ship_parcel"]  # no number stated: open under its schema


def test_numbers_outside_the_fields_bounds_are_no_candidates():
    assert "/weight_kg" not in narrow("PX12345 weighs 45 kg").narrowed.get("ship_parcel", {})


def test_no_tool_is_ever_dropped_and_untouched_tools_keep_their_schema_object():
    result = narrow("what can you do?")
    assert set(result.parameters) == {"ship_parcel", "lookup_parcel"}
    assert result.parameters["lookup_parcel"] is LOOKUP.parameters and result.narrowed == {}


def test_platform_bounds_only_where_the_schema_has_none():
    grammar, bounds = bound_free_text(SHIP.parameters, string_max=120, array_max=5)
    props = grammar["properties"]
    assert props["message"]["maxLength"] == 120 and props["tags"]["maxItems"] == 5
    assert props["tags"]["items"]["maxLength"] == 120
    assert "maxLength" not in props["parcel"] and "maxLength" not in props["pickup"]
    assert sorted(bounds) == ["/properties/message: maxLength 120", "/properties/tags/items: maxLength 120",
                              "/properties/tags: maxItems 5"]


def test_repetition_loops_are_seen_and_ordinary_text_is_not():
    assert _loop_period('{"to": "a.b.' + "Sender." * 12) == 7
    assert _loop_period("x" * 60) == 1
    assert _loop_period('[{"name": "ship_parcel", "arguments": {"message": "Happy birthday, see you on Friday!"}}]') is None


def test_an_array_of_candidates_is_bounded_by_their_number():
    mail = ToolSpec(name="notify", parameters={"type": "object", "properties": {
        "to": {"type": "array", "items": {"type": "string", "format": "email"}}}})
    result = narrow_tools([mail], [{"role": "user", "content": "tell ana@x.example and bo@y.example"}])
    to = result.parameters["notify"]["properties"]["to"]
    assert to["items"]["enum"] == ["ana@x.example", "bo@y.example"] and to["maxItems"] == 2


def test_reask_feedback_is_never_evidence():
    from decider.prompt import reask_messages

    messages = reask_messages([{"role": "user", "content": "rush it please"}], output="[]",
                              errors=[{"path": "/speed", "message": "'slow' is not one of ['standard', 'express']"}])
    result = narrow_tools([SHIP], messages)
    assert result.narrowed["ship_parcel"] == {"/speed": ["express"]}


def test_a_field_of_cents_is_offered_the_stated_amount_in_cents():
    """Issue 32: "5 dollars" offered 5 to a USD-cents field (the grammar then forced the wrong amount); now 500."""
    refund = ToolSpec(name="refund", side_effects=True, parameters={
        "type": "object", "additionalProperties": False, "required": ["order_id", "amount_cents"],
        "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]-[0-9]+$"},
                       "amount_cents": {"type": "integer", "minimum": 1,
                                        "x-unit": {"currency": "USD", "scale": "minor"}}}})
    result = narrow_tools([refund], [{"role": "user", "content": "refund order A-17 by 5 dollars, not 7 euros"}])
    assert result.narrowed["refund"]["/amount_cents"] == [500]
