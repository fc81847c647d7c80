"""Schema preparation: the feature table holds for the installed xgrammar; refusals name feature and path."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from xgrammar.testing import _is_grammar_accept_string

import decider.schema as schema_module
from decider.errors import UnsupportedSchemaError
from decider.schema import prepare_schema, tool_calls_schema, validation_errors
from decider_fixtures import load_schemas


def accepts(grammar_schema: dict, text: str) -> bool:
    return _is_grammar_accept_string(xgr.Grammar.from_json_schema(json.dumps(grammar_schema), any_whitespace=False), text)


def test_all_is_sorted():
    assert schema_module.__all__ == sorted(schema_module.__all__)


@pytest.mark.parametrize(("name", "schema"), load_schemas(), ids=[n for n, _ in load_schemas()])
def test_contract_schemas_prepare_and_compile(name, schema):
    prepared = prepare_schema(schema)
    xgr.Grammar.from_json_schema(prepared.grammar_json)  # compiles


@pytest.mark.parametrize(("keyword", "schema", "violating"), [
    ("not", {"type": "string", "not": {"const": "a"}}, '"a"'),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    ("dependentRequired", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    ("contains", {"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}, "0.3"),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    ("if", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, '{"a": 1}'),
])
def test_postchecked_features_are_reported_and_validated(keyword, schema, violating):
    prepared = prepare_schema(schema)
    assert keyword in {p.feature for p in prepared.postchecks}
    # the grammar lets the violation through (that is why it is postchecked) ...
    assert accepts(prepared.grammar_schema, violating)
    # ... and validation after decoding catches it
    assert prepared.errors(json.loads(violating))


@pytest.mark.parametrize(("schema", "feature", "path"), [
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "patternProperties", ""),
    ({"type": "object", "properties": {"a": {"type": "object", "propertyNames": {"pattern": "^x"}}}}, "propertyNames", "/properties/a"),
    ({"type": "object", "properties": {"r": {"$ref": "https://example.com/s.json"}}}, "$ref", "/properties/r/$ref"),
    ({"type": "string", "pattern": "^(?=a)a+$"}, "pattern lookaround", "/pattern"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "pattern backreference", "/pattern"),
    ({"type": "object", "properties": {"x": {"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}},
                                                                          {"properties": {"a": {"type": "string"}}}]}}},
     "allOf", "/properties/x/allOf/1/properties/a"),
    ({"type": "wat"}, "invalid schema", "/type"),
])
def test_refused_features_name_feature_and_path(schema, feature, path):
    with pytest.raises(UnsupportedSchemaError) as info:
        prepare_schema(schema)
    assert info.value.feature == feature
    assert info.value.path.startswith(path)


@pytest.mark.parametrize(("schema", "good", "bad"), [
    ({"type": "integer", "minimum": 3, "maximum": 7}, "5", "8"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, "[1, 2]", "[1]"),
    ({"type": "string", "pattern": "^[A-Z]{3}$"}, '"ABC"', '"abc"'),
    ({"type": "string", "maxLength": 2}, '"北京"', '"北京市"'),
    ({"type": "string", "format": "date"}, '"2024-01-02"', '"soon"'),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
     '{"a": 1}', '{"a": 1, "b": 2}'),
])
def test_enforced_features_are_enforced_by_the_grammar(schema, good, bad):
    prepared = prepare_schema(schema)
    assert prepared.postchecks == ()
    assert accepts(prepared.grammar_schema, good)
    assert not accepts(prepared.grammar_schema, bad)


def test_format_with_length_is_postchecked():
    prepared = prepare_schema({"type": "string", "format": "email", "maxLength": 10})
    assert "minLength/maxLength with format" in {p.feature for p in prepared.postchecks}
    assert prepared.errors("averyveryverylong@example.com")


def test_all_of_is_merged_for_the_grammar():
    prepared = prepare_schema({"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                                           {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]})
    assert not accepts(prepared.grammar_schema, '{"a": 1}')
    assert accepts(prepared.grammar_schema, '{"a": 1, "b": true}')


def test_aliases_are_allowed_by_the_grammar_and_extensions_stripped():
    prepared = prepare_schema({"type": "object", "properties": {"city": {"type": "string", "enum": ["Shanghai"],
                                                                         "x-aliases": {"沪": "Shanghai"}}},
                               "required": ["city"], "additionalProperties": False})
    assert "x-aliases" not in prepared.grammar_json
    assert accepts(prepared.grammar_schema, '{"city": "沪"}')
    assert prepared.errors({"city": "沪"})  # validation wants the canonical value (normalize first)


def test_tool_calls_schema_shape_and_bounds():
    params = [("a", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}),
              ("b", {"type": "object", "properties": {}, "additionalProperties": False})]
    schema = tool_calls_schema(params, min_calls=1, max_calls=2)
    assert schema["minItems"] == 1 and schema["maxItems"] == 2
    assert [branch["properties"]["name"] for branch in schema["items"]["anyOf"]] == [{"const": "a"}, {"const": "b"}]
    assert list(schema["items"]["anyOf"][0]["properties"]) == ["name", "arguments"]
    assert accepts(schema, '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]')
    assert not accepts(schema, '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}, {"name": "b", "arguments": {}}]')
    assert not accepts(schema, '[{"name": "c", "arguments": {}}]')
    assert not accepts(schema, "[]")
    with_text = tool_calls_schema(params, allow_text=True)
    assert accepts(with_text, '{"content": "hi"}')


def test_defs_are_hoisted_with_refs_rewritten():
    params = {"$defs": {"P": {"type": "integer", "minimum": 0, "maximum": 3}}, "type": "object",
              "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"], "additionalProperties": False}
    schema = tool_calls_schema([("t", prepare_schema(params).grammar_schema)])
    assert "t0_P" in schema["$defs"]
    assert accepts(schema, '[{"name": "t", "arguments": {"p": 2}}]')
    assert not accepts(schema, '[{"name": "t", "arguments": {"p": 9}}]')
    assert validation_errors(schema, [{"name": "t", "arguments": {"p": 2}}]) == []


@pytest.mark.parametrize("module", ["decider.schema", "decider.grammar", "decider.candidates", "decider.checked", "decider.planning",
                                    "decider.prompt", "decider.parser", "decider.service", "decider.openai_api",
                                    "decider.errors"])
def test_public_names_sorted_and_present(module):
    import importlib

    mod = importlib.import_module(module)
    assert mod.__all__ == sorted(mod.__all__)
    assert all(hasattr(mod, name) for name in mod.__all__)
