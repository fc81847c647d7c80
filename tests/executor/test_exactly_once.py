"""Side effects run once: duplicate deliveries and a worker killed mid-call."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
from tests.harness.jobs import wait_terminal
from tests.harness.processes import pool_process_of

from tools.ledger import Ledger


def _transfer_job(client: httpx.Client, request_id: str, *, amount: float, delay_s: float) -> str:
    response = client.post("/v1/jobs", headers={"X-Request-ID": request_id}, json={
        "tools": ["slow_transfer"],
        "tool_calls": [{"name": "slow_transfer", "arguments": {"from_account": "alice", "to": "bob", "amount": amount,
                                                               "currency": "CNY", "delay_s": delay_s}}]})
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def _applications_for(ledger: Ledger, job_id: str) -> list[dict]:
    return [entry for entry in ledger.applications() if entry["key"].startswith(f"{job_id}:")]


def test_duplicate_deliveries_run_the_transfer_once(client: httpx.Client, ledger: Ledger) -> None:
    from executor.worker.tasks import run_call

    before = ledger.total("CNY")
    job_id = _transfer_job(client, "dup-delivery-1", amount=1.25, delay_s=1.0)
    call_id = "call_dup-delivery-1_0"
    for _ in range(3):  # the same message delivered again while the first still runs, and after
        run_call.apply_async(args=[job_id, call_id], queue="tool.slow_transfer")
    job = wait_terminal(client, job_id, timeout_s=90)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    time.sleep(2.0)  # let the duplicate deliveries finish (they replay or no-op)
    applied = _applications_for(ledger, job_id)
    assert len(applied) == 1, applied
    assert applied[0]["cents"] == 125
    assert ledger.total("CNY") == before  # money moved, none created or destroyed
    assert job["calls"][0]["result"]["status"] == "applied"


def test_worker_killed_mid_call_still_applies_once(client: httpx.Client, ledger: Ledger, redis_client) -> None:
    before = ledger.total("CNY")
    job_id = _transfer_job(client, "kill-mid-call-1", amount=2.5, delay_s=2.0)
    deadline = time.monotonic() + 30
    started = None
    while started is None and time.monotonic() < deadline:
        started = redis_client.get("test:started:call_kill-mid-call-1_0")
        time.sleep(0.05)
    assert started, "the tool never started"
    tool_pid = int(started)
    pool_child = pool_process_of(tool_pid)  # tool → the call's init → monitor → fork server → the Celery pool process
    assert b"celery" in Path(f"/proc/{pool_child}/cmdline").read_bytes()
    os.kill(pool_child, signal.SIGKILL)  # the Celery pool process running the call dies mid-call
    job = wait_terminal(client, job_id, timeout_s=90)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    assert job["calls"][0]["attempts"] == 2  # redelivered after the kill, run again
    applied = _applications_for(ledger, job_id)
    assert len(applied) == 1, applied
    assert ledger.total("CNY") == before
    # the tool process died with its worker rather than living on as an orphan
    assert not Path(f"/proc/{tool_pid}").exists() or "zombie" in Path(f"/proc/{tool_pid}/status").read_text().lower()
    # and the worker keeps serving
    again = client.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]}).json()
    assert wait_terminal(client, again["job_id"])["status"] == "succeeded"
