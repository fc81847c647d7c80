"""The job store's writes: one compare-and-set script per update, outcome metrics inside finish_call.

Real Redis (the session's). Round trips are counted at the client: every request batch a
redis-py connection sends is one ``send_packed_command``.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest
import redis

from executor import metrics
from executor.store.models import Attempt, RecordedError
from executor.store.records import CallRecord, JobRecord, RedisJobStore


class _CountingConnection(redis.Connection):
    sent = 0

    def send_packed_command(self, command, check_health=True):  # noqa: ANN001 - redis-py's signature
        type(self).sent += 1
        return super().send_packed_command(command, check_health)


@pytest.fixture()
def counted() -> tuple[RedisJobStore, type[_CountingConnection]]:
    class Counter(_CountingConnection):
        sent = 0

    pool = redis.ConnectionPool.from_url(os.environ["REDIS_URL"], connection_class=Counter)
    client = redis.Redis(connection_pool=pool)
    store = RedisJobStore(client, prefix=f"t{uuid.uuid4().hex[:8]}")
    client.ping()
    return store, Counter


def _job() -> JobRecord:
    return JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=uuid.uuid4().hex, tenant="t", messages=[
        {"role": "user", "content": "Grüße, 東京 ☃ \U0001F600 \"quoted\" \\ back"}])


def test_update_is_one_read_and_one_write(counted) -> None:
    store, counter = counted
    job, _ = store.create(_job())
    store.update(job.job_id, lambda j: setattr(j, "status", "validating"))  # loads the script once
    before = counter.sent
    updated = store.update(job.job_id, lambda j: setattr(j, "status", "running"))
    assert counter.sent - before == 2
    again = store.get(job.job_id)
    assert again.status == updated.status == "running"
    assert again.messages == job.messages  # non-ASCII text survives the script's arguments unchanged
    events = [data["status"] for _, data in store.events(job.job_id, block_ms=50) if data.get("type") == "status"]
    assert events == ["queued", "validating", "running"]
    assert store.redis.zscore(store._active, job.job_id) == pytest.approx(updated.updated_at)  # noqa: SLF001


def test_concurrent_updates_lose_nothing(counted) -> None:
    store, _ = counted
    job, _ = store.create(_job())
    threads, per_thread = 6, 20

    def bump(worker: int) -> None:
        for n in range(per_thread):
            store.update(job.job_id, lambda j, w=worker, k=n: j.attempts.append(Attempt(attempt=k, raw_output=f"w{w}")))

    pool = [threading.Thread(target=bump, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    attempts = store.get(job.job_id).attempts
    assert len(attempts) == threads * per_thread
    assert {(a.raw_output, a.attempt) for a in attempts} == {(f"w{w}", n) for w in range(threads) for n in range(per_thread)}


def test_terminal_update_counts_the_job_once_and_leaves_active(counted) -> None:
    store, _ = counted
    job, _ = store.create(_job())
    store.update(job.job_id, lambda j: setattr(j, "status", "succeeded"))
    store.update(job.job_id, lambda j: setattr(j, "status", "succeeded"))
    key = metrics.metrics_key(store._p)  # noqa: SLF001
    assert int(store.redis.hget(key, "jobs\x1fsucceeded")) == 1
    assert store.redis.zscore(store._active, job.job_id) is None  # noqa: SLF001


def _job_with_two_calls(store) -> tuple[JobRecord, list[CallRecord]]:
    job, _ = store.create(_job())
    calls = [CallRecord(id=f"c{i}", index=i, name="get_weather", arguments={"city": "Paris"}, queue="tool.get_weather")
             for i in range(2)]
    store.set_calls(job.job_id, calls)
    return job, calls


def test_finish_call_records_outcome_and_metrics_once_in_one_round_trip(counted) -> None:
    store, counter = counted
    job, calls = _job_with_two_calls(store)
    done = calls[0].model_copy(update={"status": "succeeded", "result": {"t": 1}, "duration_s": 0.2})
    store.finish_call(job.job_id, done)  # loads the script once
    before = counter.sent
    second = calls[1].model_copy(update={"status": "failed", "error": RecordedError(type="x"), "duration_s": 0.3})
    assert store.finish_call(job.job_id, second) == 0
    assert counter.sent - before == 1
    assert store.finish_call(job.job_id, second) == -1  # already terminal: nothing recorded twice
    key = metrics.metrics_key(store._p)  # noqa: SLF001
    assert int(store.redis.hget(key, "calls\x1fget_weather\x1fsucceeded")) == 1
    assert int(store.redis.hget(key, "calls\x1fget_weather\x1ffailed")) == 1
    assert float(store.redis.hget(key, "call_s\x1fget_weather\x1fsum")) == pytest.approx(0.5)
    assert [c.status for c in store.get(job.job_id).calls] == ["succeeded", "failed"]


def test_finish_call_and_read_hands_back_the_job_as_its_step_ended(counted) -> None:
    store, counter = counted
    job, calls = _job_with_two_calls(store)
    store.update(job.job_id, lambda j: setattr(j, "status", "running"))
    first = calls[0].model_copy(update={"status": "succeeded", "result": {"t": 1}, "duration_s": 0.2})
    assert store.finish_call_and_read(job.job_id, first) == (1, None)  # loads the script once; the step goes on
    before = counter.sent
    second = calls[1].model_copy(update={"status": "failed", "error": RecordedError(type="x"), "duration_s": 0.3})
    remaining, read = store.finish_call_and_read(job.job_id, second)
    assert remaining == 0 and counter.sent - before == 1
    assert read is not None and read.job == store.get(job.job_id)
    assert [c.status for c in read.job.step_calls()] == ["succeeded", "failed"]
    assert store.finish_call_and_read(job.job_id, second) == (-1, None)  # already terminal: nothing recorded twice
    key = metrics.metrics_key(store._p)  # noqa: SLF001
    assert int(store.redis.hget(key, "calls\x1fget_weather\x1ffailed")) == 1

    before = counter.sent  # an update that starts from that read writes without reading again
    store.update(job.job_id, lambda j: setattr(j, "status", "failed"), read=read)
    assert counter.sent - before == 1
    assert store.get(job.job_id).status == "failed"
    events = [data["status"] for _, data in store.events(job.job_id, block_ms=50) if data.get("type") == "status"]
    assert events == ["queued", "running", "failed"]


def test_an_update_from_a_stale_read_reads_again_and_loses_nothing(counted) -> None:
    store, _ = counted
    job, _ = store.create(_job())
    call = CallRecord(id="c0", index=0, name="get_weather", arguments={"city": "Paris"}, queue="tool.get_weather")
    store.set_calls(job.job_id, [call])
    _, read = store.finish_call_and_read(job.job_id, call.model_copy(update={"status": "succeeded"}))
    assert read is not None
    store.update(job.job_id, lambda j: j.attempts.append(Attempt(attempt=0, raw_output="another writer")))  # stale now
    runs = []
    updated = store.update(job.job_id, lambda j: runs.append(len(j.attempts)) or j.attempts.append(
        Attempt(attempt=1, raw_output="me")), read=read)
    assert runs == [0, 1]  # refused from the stale read, done again from a fresh one
    assert [a.raw_output for a in updated.attempts] == [a.raw_output for a in store.get(job.job_id).attempts] == [
        "another writer", "me"]


def test_a_call_that_ends_its_job_costs_nine_round_trips(counted) -> None:
    """``jobs.run_call`` of a read-only tool whose call is the job's last: read the job, the concurrency slot's
    acquire and release (inside the call pipeline since issue 33; the worker task took them before, outside this
    count), mark the call running, the cancel mark read once before the call starts (a cancel that landed while
    the call waited for its slot), breaker admit and record, finish the call (reading the job back), end the job
    (one compare-and-set). A call faster than ``CANCEL_POLL_S`` never polls the cancel mark again."""
    from executor.runs import loop as jobs
    from executor.store.idempotency import IdempotencyStore
    from executor.runtime import Runtime
    from executor.sandbox.process import ProcessSandbox
    from toolrail.settings import get_settings
    from tools.registry import default_registry

    store, counter = counted
    sandbox = ProcessSandbox(warm=0)
    rt = Runtime(settings=get_settings(), redis=store.redis, store=store, idempotency=IdempotencyStore(store.redis),
                 registry=default_registry(), sandbox_factory=lambda: sandbox)

    def one_call() -> tuple[str, int]:
        job, _ = store.create(_job().model_copy(update={"tools": ["get_weather"], "status": "running"}))
        call = CallRecord(id="c0", index=0, name="get_weather", arguments={"city": "Paris", "date": "today"},
                          queue="tool.get_weather")
        store.set_calls(job.job_id, [call])
        before = counter.sent
        assert jobs.run_call(rt, job.job_id, call.id).status == "succeeded"
        return job.job_id, counter.sent - before

    try:
        one_call()  # loads the scripts
        job_id, sent = one_call()
    finally:
        sandbox.close()
    assert sent == 9
    job = store.get(job_id)
    assert job.status == "succeeded" and job.calls[0].status == "succeeded"
    statuses = [(data.get("type"), data.get("status")) for _, data in store.events(job_id, block_ms=50)]
    assert statuses == [("status", "running"), ("call", "running"), ("call", "succeeded"), ("status", "succeeded")]


#: A record as the store held it before its parts were typed (``dict[str, Any]`` then): every journal key a run
#: writes, a step whose only entry is an answer, an edited and a rejected approval, errors with details.
_ATTEMPT = {"attempt": 0, "source": "client", "raw_output": "[]", "errors": [{"path": "/city", "message": "x"}],
            "findings": [], "repairs": ["alias"], "platform": {"schema": "h"}, "usage": {"completion_tokens": 3},
            "latency_s": 0.25}
_APPROVED = {"state": "approved", "required_by": "provenance", "provenance": [{"path": "/amount", "source": "tool"}],
             "untrusted": ["/amount"], "at": 5.0, "edited": True, "original_arguments": {"amount": 1}}
_STEPS = [
    {"index": 0, "status": "ran", "tool_choice": {"type": "function", "function": {"name": "pay"}}, "started_at": 1.0,
     "decided_at": 2.0, "finished_at": 3.0, "attempts": [_ATTEMPT], "content": None, "decision_ended_at": 2.0,
     "early_dispatch": [{"id": "c0", "name": "get_weather", "dispatched_before_end_s": 0.5, "kept": False}]},
    {"index": 1, "status": "needs_review", "tool_choice": "auto", "started_at": 3.0, "decided_at": 3.5,
     "finished_at": 3.5, "attempts": [], "content": "x", "review": {"by": "reviewer", "at": 4.0, "outcome": "calls"}},
    {"index": 2, "status": "running", "tool_choice": "auto", "started_at": 4.0, "decided_at": 4.0, "finished_at": None,
     "attempts": [], "content": None, "decided_by": "reviewer",
     "approvals": {"c2": {"state": "approved", "record": _APPROVED, "arguments": {"amount": 2}}}},
    {"index": 3, "approvals": {"c3": {"state": "rejected", "record": {"state": "rejected", "required_by": "tool",
                                                                      "at": 6.0, "reason": "no"}, "arguments": None}}},
    {"index": 4, "status": "failed", "tool_choice": "auto", "started_at": 7.0, "decided_at": 7.5, "finished_at": 7.5,
     "attempts": [_ATTEMPT], "content": None, "calls_not_run": [{"name": "pay", "arguments": {"amount": 3}}],
     "ended_by": "repeated_answered_calls"},
]
_ERROR = {"type": "tool_failed", "message": "1 of 1 call(s) failed", "details": {"calls": [
    {"id": "c2", "name": "pay", "error": {"type": "tool_timeout", "message": "slow", "details": {"limit_s": 1}}}]}}


def test_a_record_stored_before_its_parts_were_typed_loads_and_is_written_back_unchanged(counted) -> None:
    store, _ = counted
    job, _ = store.create(_job())
    key = store._k(job.job_id)  # noqa: SLF001 - the record's own key: what an older release left there
    stored = {**json.loads(store.redis.get(key)), "attempts": [_ATTEMPT], "error": _ERROR, "steps": _STEPS}
    store.redis.set(key, json.dumps(stored))
    call = {"id": "c2", "index": 0, "name": "pay", "arguments": {"amount": 2}, "status": "failed", "attempts": 1,
            "result": None, "error": _ERROR["details"]["calls"][0]["error"], "repairs": [], "queue": "tool.pay",
            "step": 2, "approval": _APPROVED, "dispatched_at": 4.0, "started_at": 4.1, "finished_at": 5.1,
            "duration_s": 1.0}
    store.redis.hset(store._k(job.job_id, ":calls"), "c2", json.dumps(call))  # noqa: SLF001
    loaded = store.get(job.job_id)
    assert loaded.steps[2].approvals["c2"].record.edited and loaded.steps[1].review.outcome == "calls"
    assert loaded.error.details["calls"][0]["error"]["type"] == "tool_timeout" and loaded.calls[0].error.type == "tool_timeout"
    store.update(job.job_id, lambda j: None)  # read, typed, written back
    written = json.loads(store.redis.get(key))
    assert {k: written[k] for k in ("attempts", "error", "steps")} == {k: stored[k] for k in ("attempts", "error", "steps")}
    assert json.loads(store.get(job.job_id).calls[0].model_dump_json()) == call
    public = store.get(job.job_id).public()
    assert public["steps"][2] == {**_STEPS[2], "calls": [{k: v for k, v in call.items() if k != "queue"}]}
    assert public["steps"][3] == {**_STEPS[3], "calls": []} and public["error"] == _ERROR and public["attempts"] == [_ATTEMPT]
