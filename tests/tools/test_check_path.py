"""The one check path (``tools.check``) and the cleaner's refusals (invented inputs only)."""

from __future__ import annotations

import pytest

from tools.check import check_output, check_tool_calls
from tools.cleaning import clean_text
from tools.errors import AmbiguousOutputError
from tools.evidence import ConversationValues
from tools.spec import ToolSpec

RENAME = ToolSpec(name="rename_file", side_effects=True, parameters={
    "type": "object", "additionalProperties": False, "required": ["path", "new_name"],
    "properties": {"path": {"type": "string", "x-grounded": True}, "new_name": {"type": "string"}}})
PING = ToolSpec(name="ping_host", parameters={
    "type": "object", "additionalProperties": False, "required": ["host"], "properties": {"host": {"type": "string"}}})


@pytest.mark.parametrize("text", [
    '{"host": "a"}{"host": "b"}',
    '{"host": "a"} [1]',
    '{"host": "a", "host": "b"}',
    "{'host': 'a', 'host': 'b'}",
])
def test_ambiguous_output_is_refused_not_guessed(text):
    with pytest.raises(AmbiguousOutputError):
        clean_text(text)


def test_a_repeated_key_with_the_same_value_is_fine():
    assert clean_text('{"host": "a", "host": "a"}')[0] == {"host": "a"}


@pytest.mark.parametrize("text", [
    '\ufeff{"host": "x.example"}',
    '{\u200b"host": "x.example"}',
    '{"host": "x.example" // the host\n}',
    '{/* which */ "host": "x.example"}',
])
def test_comments_bom_and_zero_width_are_cleaned(text):
    value, notes = clean_text(text)
    assert value == {"host": "x.example"} and notes


def test_a_url_in_a_string_is_not_a_comment():
    assert clean_text('{"host": "http://x.example/a//b"}')[0] == {"host": "http://x.example/a//b"}


def test_ambiguous_call_is_a_typed_error_on_the_call():
    check = check_output('[{"name": "ping_host", "arguments": "{\\"host\\": \\"a\\", \\"host\\": \\"b\\"}"}]',
                         {"ping_host": PING})
    assert not check.ok and check.all_errors()[0]["validator"] == "ambiguous"


def test_grounding_runs_after_validation_and_only_with_evidence():
    calls = [{"name": "rename_file", "arguments": {"path": "/srv/a.txt", "new_name": "b.txt"}}]
    specs = {"rename_file": RENAME}
    assert check_tool_calls(calls, specs).ok  # no evidence given: the check is form only
    stated = ConversationValues.from_text("rename /srv/a.txt to something nicer")
    assert check_tool_calls(calls, specs, evidence=stated).ok  # new_name is free text: the model's to write
    other = ConversationValues.from_text("rename my report")
    check = check_tool_calls(calls, specs, evidence=other)
    assert not check.ok and [f["path"] for f in check.findings] == ["/path"]
    assert check.calls[0].arguments is None  # a call that failed its check carries no runnable arguments
