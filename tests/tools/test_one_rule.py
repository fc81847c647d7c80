"""One rule each: the decider hands a call back as the check path normalizes it (one alias rule, one enum
rule, one walk through ``tools.schema_walk``), and a refused tool has one record.

Before the merge the decider kept its own rules (``decider/normalize.py``): an alias matched only as
written (`` nyc `` stayed), an ambiguous enum variant took the last member (``CELSIUS`` → ``celsius`` of
``[Celsius, celsius]``), and the check path mapped aliases only in object fields (an alias in an array item,
which the grammar lets the model write, failed validation).
"""

from __future__ import annotations

import pytest

from decider import service
from tools.check import check_arguments
from tools.cleaning import canonical_value
from tools.spec import ToolSpec

CITIES = ["Shanghai", "New York"]
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "enum": CITIES, "x-aliases": {"沪": "Shanghai", "NYC": "New York"}},
    "stops": {"type": "array", "items": {"type": "string", "enum": CITIES, "x-aliases": {"沪": "Shanghai"}}},
    "legs": {"type": "array", "items": {"type": "object", "properties": {
        "to": {"type": "string", "enum": CITIES, "x-aliases": {"沪": "Shanghai"}}}}},
    "unit": {"type": "string", "enum": ["Celsius", "celsius"]},
    "mode": {"type": "string", "enum": ["train", "plane"]}}}
SPEC = ToolSpec(name="trip", parameters=SCHEMA)


@pytest.mark.parametrize(("decoded", "canonical"), [
    ({"city": "沪"}, {"city": "Shanghai"}),
    ({"city": " nyc "}, {"city": "New York"}),            # alias: exact, stripped, else case-folded
    ({"stops": ["沪", "New York"]}, {"stops": ["Shanghai", "New York"]}),  # array items too
    ({"legs": [{"to": "沪"}]}, {"legs": [{"to": "Shanghai"}]}),
    ({"mode": " Train"}, {"mode": "train"}),               # enum: the one member a variant matches
    ({"unit": "CELSIUS"}, {"unit": "CELSIUS"}),            # two members match: left for validation to refuse
])
def test_decider_and_check_path_read_a_call_the_same(decoded, canonical):
    value, _ = canonical_value(decoded, SCHEMA)
    assert value == canonical
    checked = check_arguments(SPEC, decoded)
    if checked.ok:
        assert checked.arguments == value
    else:
        assert value == decoded and [e["path"] for e in checked.errors] == ["/unit"]


def test_canonical_value_notes_each_change_and_keeps_the_input():
    decoded = {"stops": ["沪"], "mode": "PLANE"}
    value, notes = canonical_value(decoded, SCHEMA)
    assert decoded == {"stops": ["沪"], "mode": "PLANE"}
    assert notes == ("/stops/0: alias '沪' → 'Shanghai'", "/mode: enum case 'PLANE' → 'plane'")
    assert value == {"stops": ["Shanghai"], "mode": "plane"}


def test_the_decider_has_no_rule_of_its_own():
    assert service.canonical_value is canonical_value


def test_a_refused_tool_has_one_record_from_loading_to_the_check():
    """The registry's refusal is what the tool check reports (was ``registry.Problem`` → ``toolcheck.Finding``)."""
    from executor.sandbox.toolcheck import check_tools
    from tools.registry import Refusal, load_registry

    registry = load_registry(modules=["no_such_tools_module"], demo_tools=set())
    report = check_tools(registry, sandbox=False, schemas=False)
    assert report.findings == registry.problems and report.fatal == registry.problems
    refusal = registry.problems[0]
    assert isinstance(refusal, Refusal) and (refusal.kind, refusal.fatal) == ("import", True)
    assert refusal.message().startswith("module no_such_tools_module: import: cannot be imported")
