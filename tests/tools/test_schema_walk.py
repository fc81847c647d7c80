"""The one schema walker, and every stage that reads a schema, on property names that look like keywords."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from decider.candidates import narrow_tools
from decider.errors import UnsupportedSchemaError
from decider.grammar import GrammarCache
from decider.schema import bound_free_text, canonical_json, prepare_tool, tool_calls_schema
from tools.cleaning import clean_value
from tools.evidence import ConversationValues
from tools.grounding import check_grounding, declaration_errors, grounded_paths
from tools.schema_guard import check_client_schema
from tools.schema_walk import declared_types, map_described, map_subschemas, subschemas
from tools.spec import ToolSpec, strict_schema
from tools.validator import validate

#: Every property is named like a keyword; ``counts`` is a map (a record of integers).
EDGE = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["red", "blue"]},
        "format": {"type": "string"},
        "properties": {"type": "object", "properties": {"name": {"type": "string"}}},
        "$ref": {"type": "string"},
        "enum": {"type": "array", "items": {"type": "string"}},
        "items": {"type": "integer"},
        "required": {"type": "boolean"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
    "required": ["type", "items"],
}
INSTANCE = {"type": "blue", "format": "f", "properties": {"name": "n"}, "$ref": "r", "enum": ["e"], "items": 7,
            "required": True, "counts": {"apples": 2}}


def _byte_cache() -> GrammarCache:
    """xgrammar over a byte vocabulary: the grammar is built as the decider builds it, masks stay cheap."""
    info = xgr.TokenizerInfo([bytes([b]) for b in range(256)])
    return GrammarCache(xgr.GrammarCompiler(info, max_threads=1), info)


def test_subschemas_read_property_names_as_data():
    pointers = [where for where, _ in subschemas(EDGE)]
    assert pointers == ["", "/properties/type", "/properties/format", "/properties/properties",
                        "/properties/properties/properties/name", "/properties/$ref", "/properties/enum",
                        "/properties/enum/items", "/properties/items", "/properties/required", "/properties/counts",
                        "/properties/counts/additionalProperties"]


def test_subschemas_cover_every_subschema_keyword_once():
    schema = {"$defs": {"d": {"type": "string"}}, "definitions": {"e": {}}, "prefixItems": [{"type": "integer"}],
              "items": [{"type": "null"}], "anyOf": [{}], "oneOf": [{}], "allOf": [{}], "not": {}, "if": {},
              "then": {}, "else": {}, "contains": {}, "additionalProperties": False, "dependentSchemas": {"a": {}},
              "patternProperties": {"^x": {}}, "enum": [{"type": "string"}], "default": {"properties": {}},
              "x-aliases": {"type": "object"}}
    pointers = sorted(where for where, _ in subschemas(schema))
    assert pointers == sorted(["", "/$defs/d", "/definitions/e", "/prefixItems/0", "/items/0", "/anyOf/0", "/oneOf/0",
                               "/allOf/0", "/not", "/if", "/then", "/else", "/contains", "/dependentSchemas/a",
                               "/patternProperties/^x"])


def test_map_subschemas_rewrites_subschemas_only():
    out = map_subschemas(EDGE, lambda sub, where: {"at": where}, "")
    assert out["properties"]["type"] == {"at": "/properties/type"}
    assert out["required"] == ["type", "items"] and out["type"] == "object"
    assert EDGE["properties"]["type"] == {"type": "string", "enum": ["red", "blue"]}  # the input is not changed


def test_declared_types():
    assert declared_types({"type": ["string", "null"]}) == {"string", "null"}
    assert declared_types({"enum": [1, "a"]}) == set()
    assert declared_types({"enum": [1, True, None, 1.5]}, inferred=True) == {"integer", "boolean", "null", "number"}
    assert declared_types({"anyOf": [{"type": "object"}, {"const": "x"}]}, inferred=True) == {"object", "string"}


def test_map_described_pairs_instance_parts_with_their_schema():
    pairs: list[tuple[str, object]] = []
    rebuilt = map_described(INSTANCE, EDGE, lambda part, schema, where: pairs.append((where, schema.get("type"))) or part)
    assert rebuilt == INSTANCE and rebuilt is not INSTANCE
    assert ("/type", "string") in pairs and ("/properties/name", "string") in pairs and ("/enum/0", "string") in pairs


def test_strict_schema_leaves_property_names_alone_and_keeps_a_map():
    strict = strict_schema(EDGE)
    assert list(strict["properties"]) == list(EDGE["properties"])  # no "additionalProperties" among the fields
    assert strict["additionalProperties"] is False
    assert strict["properties"]["properties"]["additionalProperties"] is False  # an object parameter: strict too
    assert strict["properties"]["counts"]["additionalProperties"] == {"type": "integer"}
    assert validate({"apples": 2, "pears": 3}, strict["properties"]["counts"]) == []
    assert [e["path"] for e in validate({"apples": "two"}, strict["properties"]["counts"])] == ["/apples"]


def test_edge_schema_through_every_stage():
    check_client_schema(EDGE)
    spec = ToolSpec.from_openai({"name": "paint", "parameters": EDGE})
    assert declaration_errors(spec.parameters) == []
    prepared = prepare_tool(spec)
    grammar, bounds = bound_free_text(prepared.grammar_schema, string_max=50, array_max=3)
    props = grammar["properties"]
    assert props["format"]["maxLength"] == 50 and props["$ref"]["maxLength"] == 50
    assert props["enum"]["maxItems"] == 3 and props["properties"]["properties"]["name"]["maxLength"] == 50
    assert "maxLength" not in props["type"] and set(props) == set(EDGE["properties"])
    assert "/properties/format: maxLength 50" in bounds

    compiled = _byte_cache().compile(canonical_json(tool_calls_schema([(spec.name, grammar)])))
    matcher = xgr.GrammarMatcher(compiled.grammar)
    assert matcher.accept_string(json.dumps([{"name": "paint", "arguments": INSTANCE}], ensure_ascii=False))
    assert matcher.is_completed()

    assert prepared.errors(INSTANCE) == [] and validate(INSTANCE, spec.parameters) == []
    assert [e["path"] for e in validate({**INSTANCE, "counts": {"x": "1"}}, spec.parameters)] == ["/counts/x"]
    cleaned, notes = clean_value({**INSTANCE, "items": "7", "required": "true"}, spec.parameters)
    assert cleaned["items"] == 7 and cleaned["required"] is True and len(notes) == 2

    assert {"/type", "/items"} <= set(grounded_paths(spec.parameters, side_effects=True))
    evidence = ConversationValues.from_messages([{"role": "user", "content": "paint it blue, 7 items"}])
    assert check_grounding(spec.parameters, INSTANCE, evidence, side_effects=True) == []

    narrowing = narrow_tools([spec], [{"role": "user", "content": "paint it blue, 7 items"}])
    assert narrowing.narrowed["paint"]["/type"] == ["blue"] and narrowing.narrowed["paint"]["/items"] == [7]


def test_a_grammar_refuses_a_key_outside_a_field_named_properties():
    spec = ToolSpec.from_openai({"name": "paint", "parameters": EDGE})
    grammar, _ = bound_free_text(prepare_tool(spec).grammar_schema, string_max=50, array_max=3)
    compiled = _byte_cache().compile(canonical_json(tool_calls_schema([(spec.name, grammar)])))
    extra = {**INSTANCE, "properties": {"name": "n", "additionalProperties": False}}
    assert not xgr.GrammarMatcher(compiled.grammar).accept_string(
        json.dumps([{"name": "paint", "arguments": extra}], ensure_ascii=False))


def test_bfcl_dialect_is_refused_with_the_pointer():
    with pytest.raises(ValueError, match="/parameters/type must be 'object', got 'dict'"):
        ToolSpec.from_openai({"name": "f", "parameters": {"type": "dict", "properties": {}}})
    spec = ToolSpec.from_openai({"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "float"}}}})
    with pytest.raises(UnsupportedSchemaError) as caught:
        prepare_tool(spec)
    assert caught.value.path == "/tools/f/parameters/properties/x/type"


def test_public_names_are_sorted():
    from tools import schema_walk, validator

    for module in (schema_walk, validator):
        assert module.__all__ == sorted(module.__all__), module.__name__


def test_strict_mode_closes_a_composed_object_once():
    """Fields spread over allOf parts, or conditions in if/then: the object is closed, its parts are not."""
    composed = ToolSpec.from_openai({"name": "both", "parameters": {"type": "object", "allOf": [
        {"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"properties": {"b": {"type": "string"}}}]}})
    assert validate({"a": "x", "b": "y"}, composed.parameters) == []
    assert [e["validator"] for e in validate({"a": "x", "c": 1}, composed.parameters)] == ["unevaluatedProperties"]
    grammar, _ = bound_free_text(prepare_tool(composed).grammar_schema, string_max=20, array_max=3)
    compiled = _byte_cache().compile(canonical_json(tool_calls_schema([(composed.name, grammar)])))
    text = json.dumps([{"name": "both", "arguments": {"a": "x", "b": "y"}}])
    assert xgr.GrammarMatcher(compiled.grammar).accept_string(text)
    assert not xgr.GrammarMatcher(compiled.grammar).accept_string(text.replace('"b"', '"c"'))

    conditional = ToolSpec.from_openai({"name": "cond", "parameters": {
        "type": "object", "properties": {"kind": {"enum": ["x", "y"]}, "n": {"type": "integer"}},
        "if": {"properties": {"kind": {"const": "x"}}}, "then": {"required": ["n"]}}})
    assert "additionalProperties" not in conditional.parameters["if"]
    assert validate({"kind": "x", "n": 1}, conditional.parameters) == []
    assert validate({"kind": "y"}, conditional.parameters) == []
    assert [e["validator"] for e in validate({"kind": "x"}, conditional.parameters)] == ["required"]
    assert [e["validator"] for e in validate({"kind": "y", "z": 0}, conditional.parameters)] == ["unevaluatedProperties"]
