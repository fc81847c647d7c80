"""Relative days are read against the request's clock in the user's time zone (issue 32): the job's ``created_at``
and ``time_zone``, in both places a call's dates are checked (the decider's check path and the run loop)."""

from __future__ import annotations

from datetime import date, datetime, timezone
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from decider.checked import decide_checked
from decider.protocol import DecideRequest
from executor.api.bodies import JobCreate
from executor.runs.loop import _evidence_sources
from executor.store.records import JobRecord
from toolrail.settings import Settings
from tools.spec import ToolSpec

EVENING_UTC = datetime(2026, 3, 10, 20, tzinfo=timezone.utc).timestamp()  # already the 11th in Shanghai
BOOK = ToolSpec(name="book", side_effects=True, parameters={
    "type": "object", "additionalProperties": False, "required": ["day"],
    "properties": {"day": {"type": "string", "format": "date"}}})
ASK = [{"role": "user", "content": "book the dentist for tomorrow"}]


@pytest.mark.parametrize(("zone", "tomorrow"), [("Asia/Shanghai", date(2026, 3, 12)), (None, date(2026, 3, 11))])
def test_the_run_loop_reads_tomorrow_in_the_jobs_time_zone(zone, tomorrow):
    job = JobRecord(job_id="job_tz", request_id="r", tenant="t", created_at=EVENING_UTC, time_zone=zone, messages=ASK)
    ((source, values),) = _evidence_sources(SimpleNamespace(settings=Settings()), job, {})
    assert source.kind == "user" and values.dates == {tomorrow}


@pytest.mark.parametrize(("zone", "day", "status"), [("Asia/Shanghai", "2026-03-12", "calls"),
                                                     ("Asia/Shanghai", "2026-03-11", "needs_review"),
                                                     (None, "2026-03-11", "calls")])
def test_the_check_path_reads_tomorrow_against_the_requests_clock(zone, day, status):
    request = DecideRequest(request_id="r", messages=ASK, tools=[BOOK], now=EVENING_UTC, time_zone=zone)
    first = f'[{{"name": "book", "arguments": {{"day": "{day}"}}}}]'
    decision = decide_checked(None, request, first_output=first, max_reasks=0)
    assert decision.status == status


def test_an_unknown_time_zone_is_refused():
    with pytest.raises(ValidationError, match="unknown IANA time zone"):
        JobCreate.model_validate({"messages": ASK, "tools": ["book"], "time_zone": "Mars/Olympus_Mons"})
    assert JobCreate.model_validate({"messages": ASK, "tools": ["book"], "time_zone": "Europe/Paris"}).time_zone


CREDIT = ToolSpec(name="give_credit", side_effects=True, entrypoint="tests.nowhere:credit", parameters={
    "type": "object", "additionalProperties": False, "required": ["customer", "amount"],
    "properties": {"customer": {"type": "string", "pattern": "^C-[0-9]+$"}, "amount": {"type": "number"}}})


@pytest.mark.parametrize(("said", "status", "required_by"), [("Give C-9 a credit of 12 euros", "awaiting_approval", "unclear"),
                                                             ("Give C-9 a credit of 12", "pending", None)])
def test_the_run_loop_holds_a_value_the_users_words_leave_unclear(said, status, required_by):
    """A number said only with a currency, for a field that declares no unit: the call waits, the reason shown."""
    from executor.runs.loop import _call_records

    messages = [{"role": "user", "content": said}]
    request = DecideRequest(request_id="r", messages=messages, tools=[CREDIT])
    decision = decide_checked(None, request, first_output='[{"name": "give_credit", "arguments": '
                                                          '{"customer": "C-9", "amount": 12}}]', max_reasks=0)
    assert decision.status == "calls"  # stated, but unclearly: not a grounding finding
    job = JobRecord(job_id="job_u", request_id="r", tenant="t", messages=messages)
    (call,) = _call_records(SimpleNamespace(settings=Settings()), job, {"give_credit": CREDIT}, decision)
    assert call.status == status
    if required_by:
        assert call.approval.required_by == required_by and call.approval.untrusted == ["/amount"]
        (held,) = [e for e in call.approval.provenance if e["path"] == "/amount"]
        assert "12 EUR" in held["unclear"] and held["sources"] == []
