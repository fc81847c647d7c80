"""Nothing stranded: work a task gave up on, or that keeps vanishing, ends typed (``internal_error`` with the request
id) — a call failed and its run ended, a job lost again and again failed by the reconciler. The decide task's own
boundary, under a real worker: tests/executor/test_serve_seams.py."""

from __future__ import annotations

import time
import uuid

from executor.runs.loop import decide_job
from executor.runs.reconcile import MAX_REQUEUES, reconcile_once
from executor.runs.submit import end_stranded
from executor.store.records import JobRecord


def _job(runtime, **fields) -> JobRecord:  # noqa: ANN001 - the session runtime
    job = JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=f"stranded-{uuid.uuid4().hex[:8]}", tenant="default",
                    tools=["get_weather"], **fields)
    runtime.store.create(job)
    return job


def test_a_run_call_that_raises_ends_its_call_and_the_run(runtime) -> None:  # noqa: ANN001
    job = _job(runtime, client_output={"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing",
                                                                                            "date": "today"}}]})
    queued = []
    decide_job(runtime, job.job_id, lambda j, call: queued.append(call))
    end_stranded(runtime, "toolrail.run_call", [job.job_id, queued[0].id], TypeError("a bug in the call's bookkeeping"))
    ended = runtime.store.get(job.job_id)
    assert ended.status == "failed" and ended.error.type == "tool_failed"
    error = ended.calls[0].error
    assert ended.calls[0].status == "failed" and error.type == "internal_error"
    assert error.details == {"request_id": job.request_id, "exception": "TypeError"}
    end_stranded(runtime, "toolrail.run_call", [job.job_id, queued[0].id], TypeError("again"))  # ended once: a no-op
    assert runtime.store.get(job.job_id).error == ended.error


def test_end_stranded_never_raises(runtime) -> None:  # noqa: ANN001
    end_stranded(runtime, "toolrail.decide", ["job_that_does_not_exist"], TypeError("x"))
    end_stranded(runtime, "toolrail.run_call", ["job_that_does_not_exist", "call"], TypeError("x"))


def test_a_job_whose_work_keeps_vanishing_ends_failed(runtime) -> None:  # noqa: ANN001
    job = _job(runtime, messages=[{"role": "user", "content": "weather?"}], status="deciding")
    vanished: list[str] = []
    for _ in range(MAX_REQUEUES):  # each re-queued decide message is lost again
        time.sleep(0.05)
        reconcile_once(runtime, stale_after_s=0.01, redecide=lambda j: vanished.append(j.job_id), rerun=lambda j, c: None)
    assert vanished.count(job.job_id) == MAX_REQUEUES and runtime.store.get(job.job_id).status == "deciding"
    time.sleep(0.05)
    reconcile_once(runtime, stale_after_s=0.01, redecide=lambda j: vanished.append(j.job_id), rerun=lambda j, c: None)
    ended = runtime.store.get(job.job_id)
    assert vanished.count(job.job_id) == MAX_REQUEUES
    assert ended.status == "failed" and ended.error.type == "internal_error", ended.error
    assert ended.error.details["request_id"] == job.request_id
    assert job.job_id not in runtime.store.stale_jobs(older_than_s=0)


def test_one_error_tree_carries_status_and_retryability() -> None:
    from executor import errors

    statuses = {cls.__name__: (cls.status, cls.retryable) for cls in (
        errors.StoreUnavailableError, errors.CallInProgressError, errors.JobNotFoundError, errors.IdempotencyConflictError,
        errors.WebhookUrlError, errors.ApprovalConflictError, errors.InvalidApprovalError, errors.SandboxError)}
    assert statuses == {"StoreUnavailableError": (503, True), "CallInProgressError": (503, True),
                        "JobNotFoundError": (404, False), "IdempotencyConflictError": (409, False),
                        "WebhookUrlError": (422, False), "ApprovalConflictError": (409, False),
                        "InvalidApprovalError": (422, False), "SandboxError": (400, False)}
    hidden = errors.StoreUnavailableError("redis at 10.0.0.7:6380 refused", host="10.0.0.7").http_error()
    assert hidden == {"type": "unavailable", "message": "the job store is unavailable; retry shortly", "details": {}}
    assert errors.ApprovalConflictError("no", reason="already_decided").http_error()["type"] == "already_decided"


def test_one_mapping_turns_what_a_task_ended_on_into_the_recorded_error() -> None:
    from executor.calls.concurrency import ConcurrencyLimitedError
    from executor.errors import StoreUnavailableError, ToolCrashedError
    from executor.store.models import RecordedError

    class BoundedWait(ConcurrencyLimitedError):  # as an extension's tenant limit: a bounded wait, then its own end
        type = "bounded_wait"
        max_retries = 3

    crashed = RecordedError.of(ToolCrashedError("the tool crashed", signal=9))
    assert crashed == RecordedError(type="tool_crashed", message="the tool crashed", details={"signal": 9})
    waited = RecordedError.of(BoundedWait("no slot", limit=2), request_id="r1")
    assert waited == RecordedError(type="bounded_wait", message="no slot", details={"limit": 2, "request_id": "r1"})
    for unexpected in (StoreUnavailableError("redis down"), KeyError("a bug")):  # retries spent, a bug: no internals
        error = RecordedError.of(unexpected, request_id="r1", where="call pay")
        name = type(unexpected).__name__
        assert error.type == "internal_error" and error.details == {"request_id": "r1", "exception": name}
        assert error.message == f"call pay failed ({name}); the logs have it under request_id r1"
