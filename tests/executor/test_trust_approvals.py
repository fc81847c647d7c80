"""Approval resolution is atomic (issue 25, item 8): approve vs reject on one call, exactly one wins.

50 races through the real HTTP API (uvicorn on a loopback port, its thread pool running both requests
at once, released together by a barrier): exactly one 200 per race, the loser 409 ``already_decided``
naming the state that won, the call record holding the winner's state, and the run resumed once
(one dispatch when the approval won; none when the rejection did). The dispatcher is a recorder: what
matters is how often the API resumes the run, not the tool.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from toolrail.settings import Settings

RACES = 50
TRANSFER = {"name": "transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": 1.5, "currency": "CNY"}}


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dispatched: collections.Counter[str] = collections.Counter()
        self.next_steps: collections.Counter[str] = collections.Counter()

    def rerun(self, job, call) -> None:  # noqa: ANN001 - create_app's dispatch(job, call)
        with self.lock:
            self.dispatched[f"{job.job_id}/{call.id}"] += 1

    def enqueue(self, job) -> None:  # noqa: ANN001
        with self.lock:
            self.next_steps[job.job_id] += 1


@pytest.fixture(scope="module")
def stack(runtime) -> Iterator[tuple[str, Recorder]]:
    from executor.api.app import create_app
    from tests.harness.serving import api_server

    recorder = Recorder()
    app = create_app(Settings(rate_limit_per_s=0, reconcile_interval_s=0), runtime, enqueue=recorder.enqueue,
                     rerun=recorder.rerun, ping_workers=lambda: 1, mount_openai=False)
    with api_server(app) as base:
        yield base, recorder


def _waiting_job(client: httpx.Client) -> tuple[str, str]:
    response = client.post("/v1/jobs", json={"tools": ["transfer"], "tool_calls": [TRANSFER],
                                             "require_approval": "side_effects"})
    assert response.status_code == 202, response.text
    job = client.get(f"/v1/jobs/{response.json()['job_id']}").json()
    assert job["status"] == "awaiting_approval", json.dumps(job)[:1000]
    return job["job_id"], job["calls"][0]["id"]


def _race(base: str, job_id: str, call_id: str) -> dict[str, httpx.Response]:
    barrier = threading.Barrier(2)

    def send(decision: str) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=30) as own:
            body = {"reason": "not this one"} if decision == "reject" else {}
            barrier.wait()
            return own.post(f"/v1/jobs/{job_id}/calls/{call_id}/{decision}", json=body)

    with ThreadPoolExecutor(2) as pool:
        futures = {decision: pool.submit(send, decision) for decision in ("approve", "reject")}
        return {decision: future.result() for decision, future in futures.items()}


def test_approve_and_reject_at_once_have_exactly_one_winner(stack, runtime) -> None:
    base, recorder = stack
    two_winners, wrong_record, resumed_twice, outcomes = [], [], [], collections.Counter()
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(RACES):
            job_id, call_id = _waiting_job(client)
            answers = _race(base, job_id, call_id)
            winners = [d for d, r in answers.items() if r.status_code == 200]
            if len(winners) != 1:
                two_winners.append({d: (r.status_code, r.text[:200]) for d, r in answers.items()})
                continue
            (winner,) = winners
            (loser,) = [d for d in answers if d != winner]
            state = "approved" if winner == "approve" else "rejected"
            outcomes[state] += 1
            refused = answers[loser]
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["type"] == "already_decided" and error["details"]["approval"] == state, error
            assert answers[winner].json()["resumed"] is True
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["calls"][0]["approval"]["state"] != state:
                wrong_record.append((state, job["calls"][0]["approval"]))
            runs = recorder.dispatched[f"{job_id}/{call_id}"]
            if runs != (1 if state == "approved" else 0):
                resumed_twice.append((state, runs))
            events = [json.loads(fields[b"data"]) for _, fields in runtime.redis.xrange(runtime.store.events_key(job_id))]
            resolved = [e for e in events if e.get("type") == "approval" and e.get("status") == "resolved"]
            if len(resolved) != 1:
                resumed_twice.append((state, "resolved events", len(resolved)))
    assert not two_winners, f"{len(two_winners)} of {RACES} races had two (or no) winners: {two_winners[:3]}"
    assert not wrong_record, wrong_record[:3]
    assert not resumed_twice, resumed_twice[:3]
    assert sum(outcomes.values()) == RACES


def test_the_same_answer_twice_at_once_resumes_once(stack) -> None:
    base, recorder = stack
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(10):
            job_id, call_id = _waiting_job(client)
            barrier = threading.Barrier(2)

            def approve() -> httpx.Response:
                with httpx.Client(base_url=base, timeout=30) as own:
                    barrier.wait()
                    return own.post(f"/v1/jobs/{job_id}/calls/{call_id}/approve")

            with ThreadPoolExecutor(2) as pool:
                answers = [f.result() for f in [pool.submit(approve), pool.submit(approve)]]
            assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
            assert sorted(r.json()["repeated"] for r in answers) == [False, True]
            assert recorder.dispatched[f"{job_id}/{call_id}"] == 1


def test_two_edits_at_once_one_wins_and_the_other_is_told(stack) -> None:
    """Two reviewers edit the amount at once: one edit runs, the other reviewer gets 409 naming what won (before: both
    were told 200, each with their own amount, while one ran)."""
    base, recorder = stack
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(10):
            job_id, call_id = _waiting_job(client)
            barrier = threading.Barrier(2)

            def edit(amount: float) -> httpx.Response:
                with httpx.Client(base_url=base, timeout=30) as own:
                    barrier.wait()
                    return own.post(f"/v1/jobs/{job_id}/calls/{call_id}/approve",
                                    json={"arguments": {**TRANSFER["arguments"], "amount": amount}})

            with ThreadPoolExecutor(2) as pool:
                answers = dict(zip((11.0, 22.0), [f.result() for f in [pool.submit(edit, 11.0), pool.submit(edit, 22.0)]]))
            (winner,) = [amount for amount, r in answers.items() if r.status_code == 200]
            (loser,) = [r for r in answers.values() if r.status_code != 200]
            assert loser.status_code == 409 and loser.json()["error"]["details"]["arguments"]["amount"] == winner
            assert answers[winner].json()["call"]["arguments"]["amount"] == winner
            stored = client.get(f"/v1/jobs/{job_id}").json()["calls"][0]
            assert stored["arguments"]["amount"] == winner and recorder.dispatched[f"{job_id}/{call_id}"] == 1


def test_an_approval_whose_calls_cannot_be_queued_ends_the_job(stack, runtime) -> None:
    from executor.errors import StoreUnavailableError
    from executor.runs.approvals import resolve

    def refused(*_: object) -> None:  # the broker refusing the approved call
        raise ConnectionError("broker down")

    base, _ = stack
    with httpx.Client(base_url=base, timeout=30) as client:
        job_id, call_id = _waiting_job(client)
        with pytest.raises(StoreUnavailableError):
            resolve(runtime, job_id, call_id, tenant="default", decision="approve", dispatch=refused, next_step=None)
        ended = client.get(f"/v1/jobs/{job_id}").json()
    assert ended["status"] == "failed" and ended["error"]["type"] == "enqueue_failed", ended  # not left running
