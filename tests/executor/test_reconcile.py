"""Lost messages do not strand jobs: the reconciler re-queues work from the job store."""

from __future__ import annotations

import time
import uuid

import httpx
from tests.harness.jobs import wait_terminal

from executor.runs.loop import decide_job
from executor.runs.reconcile import reconcile_once
from executor.store.records import JobRecord
from executor.worker.tasks import dispatch_call, enqueue_decide


def _job(runtime, **fields) -> JobRecord:
    job = JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=f"recon-{uuid.uuid4().hex[:8]}", tenant="default",
                    tools=["get_weather"], **fields)
    runtime.store.create(job)
    return job


def test_lost_decide_message_is_requeued(runtime, worker, client: httpx.Client) -> None:
    job = _job(runtime, client_output={"raw_output": '{"name": "get_weather", "arguments": {"city": "沪", "date": "today"}}'})
    time.sleep(0.2)  # the job was stored but its decide message never reached the broker
    assert job.job_id in runtime.store.stale_jobs(older_than_s=0.1)
    assert reconcile_once(runtime, stale_after_s=0.1, redecide=enqueue_decide, rerun=dispatch_call) >= 1
    done = wait_terminal(client, job.job_id)
    assert done["status"] == "succeeded" and done["calls"][0]["arguments"]["city"] == "Shanghai"
    assert job.job_id not in runtime.store.stale_jobs(older_than_s=0)


def test_lost_call_message_is_requeued(runtime, worker, client: httpx.Client) -> None:
    job = _job(runtime, client_output={"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]})
    lost = []
    decide_job(runtime, job.job_id, lambda j, call: lost.append(call))  # the run message is lost on the way
    assert len(lost) == 1 and runtime.store.get(job.job_id).status == "running"
    time.sleep(0.2)
    assert reconcile_once(runtime, stale_after_s=0.1, redecide=enqueue_decide, rerun=dispatch_call) >= 1
    done = wait_terminal(client, job.job_id)
    assert done["status"] == "succeeded" and done["calls"][0]["status"] == "succeeded"


def test_fresh_jobs_are_left_alone(runtime) -> None:
    job = _job(runtime, client_output={"raw_output": "{}"})
    requeued: list[str] = []
    reconcile_once(runtime, stale_after_s=3600, redecide=lambda j: requeued.append(j.job_id), rerun=lambda j, c: None)
    assert job.job_id not in requeued
    runtime.store.forget_active(job.job_id)
