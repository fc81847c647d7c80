"""Lost messages do not strand jobs: the reconciler re-queues work from the job store."""

from __future__ import annotations

import time
import uuid

import httpx
from tests.harness.jobs import wait_terminal

from executor.runs.loop import decide_job
from executor.runs.policy import open_step
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


def test_after_a_death_only_work_no_worker_began_is_queued_again(runtime) -> None:
    """``pending_only`` (a worker's death: its messages not yet noted as unacked are lost): a pending call and a
    decision not begun are queued again; a running call, a decision begun and a step whose calls all ended are not."""
    calls = [{"name": "get_weather", "arguments": {"city": city, "date": "today"}} for city in ("Beijing", "Kyiv")]
    running = _job(runtime, client_output={"tool_calls": calls})
    decide_job(runtime, running.job_id, lambda j, call: None)  # both call messages lost
    started = runtime.store.get(running.job_id).calls[0]
    started.status = "running"
    runtime.store.put_call(running.job_id, started)
    ended = _job(runtime, client_output={"tool_calls": calls[:1]})
    decide_job(runtime, ended.job_id, lambda j, call: None)
    last = runtime.store.get(ended.job_id).calls[0]
    last.status = "succeeded"
    runtime.store.put_call(ended.job_id, last)
    waiting = _job(runtime, client_output={"raw_output": "{}"})  # queued: its decision not begun
    deciding = _job(runtime, client_output={"raw_output": "{}"})
    runtime.store.update(deciding.job_id, lambda j: setattr(j, "status", "deciding") or open_step(j) and None)
    time.sleep(0.2)
    queued: list[str] = []
    reconcile_once(runtime, stale_after_s=0.1, redecide=lambda j: queued.append(j.job_id),
                   rerun=lambda j, c: queued.append(c.id), pending_only=True)
    ours = {running.job_id, ended.job_id, waiting.job_id, deciding.job_id}
    ours |= {c.id for job in (running, ended) for c in runtime.store.get(job.job_id).calls}
    assert [q for q in queued if q in ours] == [runtime.store.get(running.job_id).calls[1].id, waiting.job_id], queued
    for job in ours:
        runtime.store.forget_active(job)
