"""Agent runs: steps until a text answer, results paired in call order, guards, human approval, crash resume.

Real Redis (a database of the session's server of its own, so these workers never take another
module's messages), a real Celery worker pool and the real API; the decider is the scripted double
of tests/executor/scripted_decider.py (the real model's runs are in tests/e2e).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.harness.jobs import publishers
from tests.harness.processes import decider_worker, pool_process_of
from tests.harness.receiver import Receiver, wait_for

from executor.job_client import wait_for_job
from tools.ledger import Ledger

LEDGER_PREFIX = "runs:ledger"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"runs-test-webhook-key-0123456789").decode()
KEYS = {"alice": "key-alice", "bob": "key-bob"}


@pytest.fixture(scope="module")
def marker_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="toolrail-runs-"))


@pytest.fixture(scope="module")
def run_worker(db_url: str, marker_dir: Path) -> Iterator[object]:
    env = {"TOOLRAIL_LEDGER_PREFIX": LEDGER_PREFIX, "TOOLRAIL_TEST_MARKER_DIR": str(marker_dir),
           "TOOLRAIL_RUN_MAX_IDENTICAL_CALLS": "2", "TOOLRAIL_API_KEYS": ",".join(f"{k}:{t}" for t, k in KEYS.items()),
           "TOOLRAIL_WEBHOOK_ALLOW_PRIVATE": "1", "TOOLRAIL_WEBHOOK_SECRETS": f"alice:{WEBHOOK_SECRET}",
           "TOOLRAIL_WEBHOOK_BACKOFF_S": "0.2"}
    with decider_worker(db_url, factory="tests.executor.scripted_decider:make", env=env, queues=("webhooks",),
                        name="runs") as proc:
        yield proc


@pytest.fixture(scope="module")
def runtime(db_url: str):
    from executor.runtime import Runtime
    from toolrail.settings import Settings

    return Runtime.from_settings(Settings(decider="custom", run_max_identical_calls=2), redis_url=db_url)


@pytest.fixture(scope="module")
def api(runtime, run_worker, db_url: str) -> Iterator[str]:
    from executor.api.app import create_app
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    enqueue, rerun = publishers(db_url)
    settings = Settings(decider="custom", api_keys=",".join(f"{k}:{t}" for t, k in KEYS.items()), reconcile_interval_s=0,
                        webhook_allow_private=True)
    with api_server(create_app(settings, runtime, mount_openai=False, ping_workers=lambda: 1,
                               enqueue=enqueue, rerun=rerun)) as base:
        yield base


@pytest.fixture()
def client(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30, headers={"Authorization": f"Bearer {KEYS['alice']}"}) as c:
        yield c


@pytest.fixture(scope="module")
def ledger(db_url: str) -> Ledger:
    book = Ledger(redis.Redis.from_url(db_url), prefix=LEDGER_PREFIX)
    book.seed()
    return book


def _submit(client: httpx.Client, steps: list[dict], *, tools: list[str], **extra) -> str:
    body = {"messages": [{"role": "user", "content": "RUN " + json.dumps({"steps": steps})}], "tools": tools, **extra}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def _wait(client: httpx.Client, job_id: str, statuses: set[str], timeout_s: float = 90.0) -> dict:
    job = wait_for_job(client, job_id, timeout_s=timeout_s, poll_s=0.1, until=statuses)
    assert job.get("status") in statuses, f"job {job_id} never reached {statuses}: {json.dumps(job)[:3000]}"
    return job


ENDED = {"succeeded", "failed", "needs_review", "cancelled", "expired"}


def _transfer(amount: float, delay_s: float = 0.2) -> dict:
    return {"name": "slow_transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": amount,
                                                   "currency": "CNY", "delay_s": delay_s}}


def _applied(ledger: Ledger, job_id: str) -> list[dict]:
    return [entry for entry in ledger.applications() if entry["key"].startswith(f"{job_id}:")]


def test_run_goes_on_until_the_model_answers(client: httpx.Client) -> None:
    job_id = _submit(client, [{"calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]},
                              {"text": "done: {results}"}], tools=["get_weather"])
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert job["max_steps"] == 4  # a conversation without calls of its own runs TOOLRAIL_MAX_STEPS steps
    assert [s["index"] for s in job["steps"]] == [0, 1]
    assert [s["status"] for s in job["steps"]] == ["ran", "succeeded"]
    first = job["steps"][0]["calls"]
    assert len(first) == 1 and first[0]["status"] == "succeeded" and first[0]["step"] == 0
    # the model saw the result of the call it made, answered by that call's id
    answered = json.loads(job["content"].removeprefix("done: "))
    assert answered[0][0] == first[0]["id"]
    assert json.loads(answered[0][1]) == first[0]["result"]
    assert job["steps"][1]["calls"] == [] and job["steps"][1]["tool_choice"] == "auto"


def test_parallel_results_are_paired_and_kept_in_call_order(client: httpx.Client) -> None:
    job_id = _submit(client, [{"calls": [{"name": "slow_echo", "arguments": {"value": "first", "delay_s": 1.5}},
                                         {"name": "slow_echo", "arguments": {"value": "second", "delay_s": 0}}]},
                              {"text": "{results}"}], tools=["slow_echo"])
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    calls = job["steps"][0]["calls"]
    assert calls[1]["result"]["finished_at"] < calls[0]["result"]["finished_at"]  # they finished out of order
    seen = json.loads(job["content"])
    assert [pair[0] for pair in seen] == [calls[0]["id"], calls[1]["id"]]  # results in call order, by call id
    assert [json.loads(pair[1])["value"] for pair in seen] == ["first", "second"]


def test_a_tool_error_is_a_result_the_model_sees(client: httpx.Client) -> None:
    job_id = _submit(client, [{"calls": [_transfer(10_000_000)]}, {"text": "{results}"}], tools=["slow_transfer"])
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]  # the run went on after the failed call
    assert job["steps"][0]["calls"][0]["status"] == "failed"
    seen = json.loads(job["content"])
    assert json.loads(seen[0][1])["error"]["type"]  # typed and short


def test_identical_calls_trip_the_loop_guard(client: httpx.Client, api: str) -> None:
    same = {"calls": [{"name": "poll_ticket", "arguments": {"ticket": "T-1"}}]}  # a repeatable poll
    job_id = _submit(client, [same, same, same, same, {"text": "never"}], tools=["poll_ticket"], max_steps=8)
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "failed"
    assert job["error"]["type"] == "loop_detected", job["error"]
    assert len(job["calls"]) == 2  # the third identical call never ran (limit 2 in this module)
    assert job["steps"][-1]["calls_not_run"][0]["name"] == "poll_ticket"
    scrape = httpx.get(f"{api}/metrics").text
    assert 'toolrail_run_guard_trips_total{guard="identical_calls"}' in scrape


def test_a_repeat_of_an_answered_call_is_reasked_for_the_answer(client: httpx.Client) -> None:
    same = {"calls": [{"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}], "then": "sunny"}
    job = _wait(client, _submit(client, [same, same], tools=["get_weather"]), ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert job["content"] == "answer only: sunny" and len(job["calls"]) == 1  # the repeat never ran
    attempts = job["steps"][1]["attempts"]
    assert attempts[0]["errors"][0]["validator"] == "repeated_call"
    assert attempts[1]["platform"]["reask_tool_choice"] == "none"  # what the platform did is on the record


def test_a_call_written_as_text_after_its_result_ends_the_run_on_its_results(client: httpx.Client) -> None:
    # what the 135M model does after a result (bench/newcomer.py): the same call, then, offered the answer only, that
    # call written as text. Before (issue 32): needs_review (call_as_text), a person asked to decide nothing
    same = {"calls": [{"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}],
            "then": 'get_weather(city="Paris", date="today")'}
    job = _wait(client, _submit(client, [same, same], tools=["get_weather"]), ENDED)
    assert job["status"] == "succeeded" and job["error"] is None, json.dumps(job)[:3000]
    assert [c["status"] for c in job["calls"]] == ["succeeded"]  # the results are the outcome; the repeat never ran
    last = job["steps"][-1]
    assert last["ended_by"] == "repeated_answered_calls" and last["status"] == "succeeded"
    assert [a["errors"][0]["validator"] for a in last["attempts"]] == ["repeated_call", "call_as_text"]


def test_an_approved_side_effect_proposed_again_is_not_run_again_and_the_run_answers(client: httpx.Client,
                                                                                    ledger: Ledger) -> None:
    # before (issue 32): the repeat was a repeated_side_effect, re-asked, then needs_review — a person asked to confirm
    # the transfer they had just approved; now, nobody having asked for it again, the model is offered the answer only
    again = {"calls": [_transfer(2.5)], "then": "transferred"}
    job_id = _submit(client, [{"calls": [_transfer(2.5)]}, again], tools=["slow_transfer"],
                     require_approval=["slow_transfer"])
    (call,) = _wait(client, job_id, {"awaiting_approval"})["calls"]
    assert client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve").status_code == 200
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded" and job["content"] == "answer only: transferred", json.dumps(job)[:3000]
    assert len(_applied(ledger, job_id)) == 1 and len(job["calls"]) == 1
    assert job["steps"][1]["attempts"][0]["errors"][0]["validator"] == "repeated_call"


def test_max_steps_ends_a_run_that_never_answers(client: httpx.Client) -> None:
    steps = [{"calls": [{"name": "get_weather", "arguments": {"city": city, "date": "today"}}]} for city in ("Rome", "Oslo", "Lima")]
    job = _wait(client, _submit(client, steps, tools=["get_weather"], max_steps=2), ENDED)
    assert job["status"] == "failed" and job["error"]["type"] == "max_steps_reached", job.get("error")
    assert [s["index"] for s in job["steps"]] == [0, 1]
    assert all(c["status"] == "succeeded" for c in job["calls"])  # what it did is kept


def test_single_step_jobs_behave_as_before(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]})
    job = _wait(client, response.json()["job_id"], ENDED)
    assert job["status"] == "succeeded" and job["max_steps"] == 1 and job["content"] is None
    assert len(job["steps"]) == 1 and job["calls"][0]["status"] == "succeeded"


def test_approval_holds_the_call_then_runs_it_once(client: httpx.Client, ledger: Ledger) -> None:
    job_id = _submit(client, [{"calls": [_transfer(3.5)]}, {"text": "{results}"}], tools=["slow_transfer"],
                     require_approval=["slow_transfer"])
    job = _wait(client, job_id, {"awaiting_approval", *ENDED})
    assert job["status"] == "awaiting_approval", json.dumps(job)[:2000]
    call = job["calls"][0]
    assert call["status"] == "awaiting_approval" and call["approval"]["state"] == "pending"
    assert call["approval"]["required_by"] == "job"
    time.sleep(1.0)
    assert _applied(ledger, job_id) == []  # nothing ran while waiting
    first = client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
    assert first.status_code == 200, first.text
    assert first.json()["resumed"] is True
    again = client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
    assert again.status_code == 200 and again.json()["repeated"] is True  # idempotent
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert len(_applied(ledger, job_id)) == 1
    assert job["calls"][0]["approval"]["state"] == "approved"
    late = client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/reject", json={"reason": "too late"})
    assert late.status_code == 409 and late.json()["error"]["type"] == "already_decided"


def test_approval_with_edited_arguments_validated_again(client: httpx.Client, ledger: Ledger) -> None:
    job_id = _submit(client, [{"calls": [_transfer(4.0)]}, {"text": "{results}"}], tools=["slow_transfer"],
                     require_approval="side_effects")
    call = _wait(client, job_id, {"awaiting_approval", *ENDED})["calls"][0]
    url = f"/v1/jobs/{job_id}/calls/{call['id']}/approve"
    bad = client.post(url, json={"arguments": {**call["arguments"], "amount": -5}})
    assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_arguments", bad.text
    assert client.get(f"/v1/jobs/{job_id}").json()["calls"][0]["approval"]["state"] == "pending"  # nothing changed
    good = client.post(url, json={"arguments": {**call["arguments"], "amount": 1.25}})
    assert good.status_code == 200, good.text
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    applied = _applied(ledger, job_id)
    assert len(applied) == 1 and applied[0]["cents"] == 125
    approval = job["calls"][0]["approval"]
    assert approval["edited"] is True and approval["original_arguments"]["amount"] == 4.0


def test_rejection_is_a_result_the_model_sees(client: httpx.Client, ledger: Ledger) -> None:
    job_id = _submit(client, [{"calls": [_transfer(2.0)]}, {"text": "{results}"}], tools=["slow_transfer"],
                     require_approval=["slow_transfer"])
    call = _wait(client, job_id, {"awaiting_approval", *ENDED})["calls"][0]
    response = client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/reject", json={"reason": "not this account"})
    assert response.status_code == 200, response.text
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert job["calls"][0]["status"] == "rejected"
    seen = json.loads(job["content"])
    assert json.loads(seen[0][1])["error"] == {"type": "rejected", "message": "not this account"}
    assert _applied(ledger, job_id) == []


def test_approval_expires(client: httpx.Client, runtime) -> None:
    from executor.runs.approvals import expire_due

    job_id = _submit(client, [{"calls": [_transfer(1.0)]}], tools=["slow_transfer"],
                     require_approval="side_effects", approval_timeout_s=0.5)
    call = _wait(client, job_id, {"awaiting_approval", *ENDED})["calls"][0]
    time.sleep(0.8)
    assert expire_due(runtime) >= 1
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "expired" and job["error"]["type"] == "approval_expired"
    late = client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
    assert late.status_code == 409 and late.json()["error"]["type"] == "job_not_waiting"


def test_approval_bad_input(client: httpx.Client, api: str) -> None:
    job_id = _submit(client, [{"calls": [_transfer(1.0)]}], tools=["slow_transfer"], require_approval="side_effects")
    call = _wait(client, job_id, {"awaiting_approval", *ENDED})["calls"][0]
    base = f"/v1/jobs/{job_id}/calls"
    assert client.post(f"{base}/call_nope/approve").status_code == 404
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {KEYS['bob']}"}) as bob:
        assert bob.post(f"{base}/{call['id']}/approve").status_code == 404  # another tenant's call
    assert client.post(f"{base}/{call['id']}/approve", json={"arguments": "x"}).status_code == 422
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    after = client.post(f"{base}/{call['id']}/approve")
    assert after.status_code == 409, after.text
    plain = client.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo", "date": "today"}}]}).json()["job_id"]
    done = _wait(client, plain, ENDED)
    not_waiting = client.post(f"/v1/jobs/{plain}/calls/{done['calls'][0]['id']}/approve")
    assert not_waiting.status_code == 409 and not_waiting.json()["error"]["type"] == "not_awaiting_approval"
    for body, kind in (({"max_steps": 0}, "validation_error"), ({"max_steps": 10_000}, "validation_error"),
                       ({"require_approval": ["no_such_tool"]}, "unknown_tool")):
        response = client.post("/v1/jobs", json={"messages": [{"role": "user", "content": "hi"}], "tools": ["get_weather"],
                                                 **body})
        assert response.status_code == 422 and response.json()["error"]["type"] == kind, response.text


@pytest.mark.parametrize("step", [0, 1], ids=["before-the-call", "during-the-next-decision"])
def test_worker_killed_while_deciding_resumes_the_run(client: httpx.Client, ledger: Ledger, marker_dir: Path,
                                                       step: int) -> None:
    request_id = f"kill-decide-{step}-{time.time_ns()}"
    first: dict = {"calls": [_transfer(0.75)], **({"sleep_s": 3} if step == 0 else {})}
    second: dict = {"text": "{results}", **({"sleep_s": 3} if step == 1 else {})}
    response = client.post("/v1/jobs", headers={"X-Request-ID": request_id}, json={
        "messages": [{"role": "user", "content": "RUN " + json.dumps({"steps": [first, second]})}],
        "tools": ["slow_transfer"]})
    job_id = response.json()["job_id"]
    marker = marker_dir / f"deciding-{request_id}-{step}"
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the decision never started"
    os.kill(pool_process_of(int(marker.read_text())), signal.SIGKILL)  # the pool process deciding the step dies
    job = _wait(client, job_id, ENDED, timeout_s=120)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert len(_applied(ledger, job_id)) == 1  # the step-0 transfer was not run again
    assert job["calls"][0]["attempts"] == 1
    assert len(json.loads(job["content"])) == 1


def test_worker_killed_mid_call_applies_once_and_the_run_goes_on(client: httpx.Client, ledger: Ledger, db_url: str) -> None:
    request_id = f"kill-call-{time.time_ns()}"
    response = client.post("/v1/jobs", headers={"X-Request-ID": request_id}, json={
        "messages": [{"role": "user", "content": "RUN " + json.dumps({"steps": [
            {"calls": [_transfer(0.5, delay_s=2.0)]}, {"text": "{results}"}]})}], "tools": ["slow_transfer"]})
    job_id = response.json()["job_id"]
    store = redis.Redis.from_url(db_url)
    key = f"test:started:call_{request_id}_0"
    deadline = time.monotonic() + 60
    while store.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.get(key), "the tool never started"
    os.kill(pool_process_of(int(store.get(key))), signal.SIGKILL)
    job = _wait(client, job_id, ENDED, timeout_s=120)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert len(_applied(ledger, job_id)) == 1 and job["calls"][0]["attempts"] == 2


def test_a_lost_advance_is_found_by_the_reconciler(client: httpx.Client, runtime) -> None:
    """The process that ended a step's last call died before queuing the next decision: the reconciler moves it."""
    from executor.runs.reconcile import reconcile_once

    job_id = _submit(client, [{"calls": [{"name": "get_weather", "arguments": {"city": "Kyiv", "date": "today"}}]},
                              {"text": "{results}"}], tools=["get_weather"])
    job = _wait(client, job_id, ENDED)
    assert job["status"] == "succeeded"
    # put the record back to where a death after the call's end leaves it: running, every call terminal
    def rewind(record) -> None:
        record.status, record.step, record.content = "running", 0, None
        record.steps = record.steps[:1]
        record.steps[0].status, record.steps[0].finished_at = "running", None
    runtime.store.update(job_id, lambda record: rewind(record) and None)
    queued: list[str] = []
    assert reconcile_once(runtime, stale_after_s=-1, redecide=lambda j: queued.append(j.job_id),
                          rerun=lambda j, c: queued.append(c.id)) >= 0
    after = client.get(f"/v1/jobs/{job_id}").json()
    assert after["status"] == "deciding" and after["step"] == 1
    assert job_id in queued and job["calls"][0]["id"] not in queued  # the next decision queued, the call not re-run


def test_webhooks_tell_the_receiver_about_approval_and_the_end(client: httpx.Client) -> None:
    with Receiver(status=204) as receiver:
        url = receiver.url("/hook")
        job_id = _submit(client, [{"calls": [_transfer(0.25)]}, {"text": "ok"}], tools=["slow_transfer"],
                         require_approval="side_effects", webhook_url=url)
        call = _wait(client, job_id, {"awaiting_approval", *ENDED})["calls"][0]
        wait_for(receiver.seen, 30)
        client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
        assert _wait(client, job_id, ENDED)["status"] == "succeeded"
        both = wait_for(lambda: receiver.seen() if len(receiver.seen()) >= 2 else None, 60)
        received = [(r["headers"], r["body"]) for r in both]
    events = [json.loads(body)["type"] for _, body in received]
    assert events == ["job.awaiting_approval", "job.succeeded"], events
    key = base64.b64decode(WEBHOOK_SECRET.removeprefix("whsec_"))
    for headers, body in received:  # Standard Webhooks: v1,base64(HMAC-SHA256(key, id.timestamp.body))
        signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
        expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        assert expected in headers["webhook-signature"].split()
    record = client.get(f"/v1/jobs/{job_id}").json()
    assert [d["event"] for d in record["webhooks"]] == ["job.awaiting_approval", "job.succeeded"]
