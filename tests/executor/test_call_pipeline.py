"""The call pipeline (``executor.calls``): its stages in order, a new stage as one class and one line, and a
cancelled job's running call stopped — its tool process killed, its idempotency record honest, its breaker
untouched.

Real Redis (a database of the session's own), the real process sandbox, ``run_call`` called in a thread as the
worker task calls it; the test tools of ``tests/executor/tools_for_tests.py``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.executor.tools_for_tests import EchoArgs
from tests.harness.databases import own_database

from executor.calls import stages
from executor.calls.pipeline import Invocation, Next, Outcome
from executor.errors import SandboxError
from executor.runs import loop
from executor.runtime import Runtime
from executor.runs.submit import cancel
from executor.store.records import CallRecord, JobRecord
from toolrail.settings import get_settings
from tools.registry import Registry, default_registry
from tools.spec import ToolSpec

#: A tool that sleeps past its 2 s limit unless stopped: before cancellation reached the sandbox, each cancelled
#: call ran to that limit and ended ``tool_timeout`` — a health failure, five of which opened the breaker.
SLEEPY = ToolSpec.from_model("sleepy", EchoArgs, entrypoint="tests.executor.tools_for_tests:slow_echo", timeout_s=2)


#: The one thread that runs calls, as a worker process's does: the sandbox's fork server dies with the thread that
#: started it (``PR_SET_PDEATHSIG``), so a thread per call would lose it between calls.
WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-call-worker")


@pytest.fixture(scope="module")
def rt() -> Iterator[Runtime]:
    runtime = Runtime.from_settings(get_settings(), redis_url=own_database(__name__))
    runtime.registry = Registry([*default_registry().specs(), SLEEPY])
    assert _run(runtime, _job(runtime, "sleepy", {"value": "warm"})).status == "succeeded"  # the fork server is up
    yield runtime
    WORKER.submit(runtime.sandbox.close).result()


def _run(rt: Runtime, job_id: str) -> CallRecord:
    return WORKER.submit(loop.run_call, rt, job_id, "c0").result(timeout=30)


def _job(rt: Runtime, tool: str, arguments: dict[str, Any], tenant: str = "default") -> str:
    job = JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=uuid.uuid4().hex, tenant=tenant, status="running",
                    tools=[tool])
    job.calls = [CallRecord(id="c0", index=0, name=tool, arguments=arguments, queue=f"tool.{tool}")]
    rt.store.create(job)
    return job.job_id


def _run_and_cancel(rt: Runtime, job_id: str, *, after: float = 0.6) -> tuple[CallRecord, float]:
    """``run_call`` on the worker thread (as the worker task runs it); the job cancelled once the call has run for
    ``after`` seconds. Returns the call and how long it took to end after the cancel."""
    started = time.monotonic()
    running = WORKER.submit(loop.run_call, rt, job_id, "c0")
    while rt.store.get_call(job_id, "c0").status != "running":
        assert time.monotonic() - started < 20, "the call never started"
        time.sleep(0.02)
    time.sleep(after)
    _, cancelled = cancel(rt, job_id, "the test cancelled it")
    assert cancelled
    cancelled_at = time.monotonic()
    return running.result(timeout=15), time.monotonic() - cancelled_at


def test_five_cancellations_do_not_open_the_breaker_and_each_call_stops_at_once(rt: Runtime) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    rt.breaker.reset("sleepy", tenant)
    for _ in range(rt.breaker.failures):
        job_id = _job(rt, "sleepy", {"value": "x", "delay_s": 9}, tenant=tenant)
        call, took = _run_and_cancel(rt, job_id)
        assert call.status == "failed" and call.error.type == "call_cancelled", call.error
        assert took < 1.5 and call.error.details["stopped_after_s"] < SLEEPY.timeout_s  # stopped, not run to its limit
    assert rt.breaker.state("sleepy", tenant) == {"state": "closed", "failures": 0, "opens": 0}
    # the breaker still counts the tool's own ill health: a run to its limit is one failure
    call = _run(rt, _job(rt, "sleepy", {"value": "x", "delay_s": 9}, tenant=tenant))
    assert call.error.type == "tool_timeout" and rt.breaker.state("sleepy", tenant)["failures"] == 1


def test_a_cancelled_side_effect_is_killed_and_its_idempotency_record_says_so(rt: Runtime) -> None:
    job_id = _job(rt, "slow_transfer", {"from_account": "alice", "to": "bob", "amount": 1, "delay_s": 6})
    call, took = _run_and_cancel(rt, job_id, after=1.0)
    assert took < 1.5 and call.error.type == "call_cancelled"
    record = json.loads(rt.redis.get(rt.idempotency.key(job_id, "c0")))
    assert record["state"] == "completed" and record["outcome"]["ok"] is False and record["outcome"]["cancelled"] is True
    assert "may stand" in record["outcome"]["error"]["message"]
    pid = int(rt.redis.get("test:started:c0"))  # the tool process's host pid, as it wrote it
    assert not _alive(pid), "the cancelled call's tool process still runs"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_call_of_a_job_cancelled_before_it_starts_does_not_run(rt: Runtime) -> None:
    job_id = _job(rt, "sleepy", {"value": "x", "delay_s": 5})
    rt.store.update(job_id, lambda j: setattr(j, "status", "cancelled"))  # cancelled between the task's read and the run
    outcome = stages.Cancellation(rt.store)(_invocation(rt, job_id), lambda inv: pytest.fail("the call ran"))
    assert not outcome.ok and outcome.error.type == "call_cancelled"


class QuotaExceededError(SandboxError):
    type = "quota_exceeded"


class Quota:
    """A test stage: each tenant may run ``limit`` calls; it sees the call already marked running."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.seen = limit, 0, []

    def __call__(self, invocation: Invocation, next: Next) -> Outcome:  # noqa: A002
        self.seen.append(invocation.call.status)
        if self.used >= self.limit:
            return Outcome.failed(QuotaExceededError("the tenant's quota is spent", limit=self.limit))
        self.used += 1
        return next(invocation)


def test_a_new_stage_is_one_class_and_one_line(rt: Runtime) -> None:
    quota = Quota(limit=1)
    standard = rt.calls
    rt.calls = standard.with_stage(quota, before=stages.Span)  # the one line
    try:
        first = _run(rt, _job(rt, "sleepy", {"value": "a"}))
        second = _run(rt, _job(rt, "sleepy", {"value": "b"}))
    finally:
        rt.calls = standard
    assert first.status == "succeeded" and first.result["value"] == "a"
    assert second.status == "failed" and second.error.type == "quota_exceeded"
    assert quota.seen == ["running", "running"]
    assert [type(s).__name__ for s in rt.calls.with_stage(quota, before=stages.Span).stages] == [
        "Slot", "Admission", "Idempotency", "Running", "Cancellation", "Quota", "Span", "Breaker"]


def _invocation(rt: Runtime, job_id: str) -> Invocation:
    from executor.sandbox.boundary import CallRun

    job = rt.store.get(job_id)
    call = job.calls[0]
    return Invocation(job_id=job_id, tenant=job.tenant, call=call, spec=rt.registry.get(call.name), queue=call.queue,
                      run=CallRun(request_id=job.request_id, job_id=job_id, call_id=call.id,
                                  idempotency_key=f"{job_id}:{call.id}", arguments=call.arguments or {}))
