"""Smaller leaks (issue 25, item 9): the public scrape names no tenant's private tools; no full URL in logs.

- ``/metrics`` without the metrics key: a tenant's MCP tools (``<server>__<tool>``) and their queues
  (``mcp.<tenant>.<server>``) are summed as ``mcp``; the metrics key shows them.
- A real Celery worker at ``--loglevel INFO`` delivers a webhook to a URL with secrets in its path and
  query: its log never holds them (httpx's INFO line printed the whole URL).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.harness.databases import own_database
from tests.harness.jobs import publishers
from tests.harness.receiver import Receiver, wait_for

from executor.job_client import wait_for_job
from executor.stack import stop_process, wait_for_workers
from executor.store.records import CallRecord, JobRecord

KEYS = "key-metrics-alpha:alpha"
METRICS_KEY = "metrics-key-25"
PRIVATE = "acmebank__wire_funds"  # a tenant's MCP tool: it names the tenant's server and what it does
SECRET_PATH, SECRET_QUERY = "hook-path-4f9a1c", "tok-77e2b0d5"


def _finish(runtime, name: str, queue: str) -> None:
    """A call of ``name`` becoming final through the job store: the path that counts every call."""
    call = CallRecord(id=f"call_{name}", index=0, name=name, status="running", queue=queue)
    job = JobRecord(job_id=f"job_{os.urandom(8).hex()}", request_id="req-metrics", tenant="alpha", status="running",
                    calls=[call])
    runtime.store.create(job)
    runtime.store.finish_call(job.job_id, call.model_copy(update={"status": "succeeded", "duration_s": 0.2}))


def test_the_public_scrape_names_no_tenants_private_tools(tmp_path) -> None:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail.settings import Settings

    settings = Settings(api_keys=KEYS, metrics_key=METRICS_KEY, rate_limit_per_s=0, reconcile_interval_s=0)
    runtime = Runtime.from_settings(settings, redis_url=own_database(f"{__name__}:metrics"))
    _finish(runtime, PRIVATE, "mcp.alpha.acmebank")
    _finish(runtime, "get_weather", "tool.get_weather")
    with api_server(create_app(settings, runtime, enqueue=lambda job: None, ping_workers=lambda: 1,
                               mount_openai=False)) as base:
        public = httpx.get(f"{base}/metrics", timeout=30).text
        keyed = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}, timeout=30).text
    assert "acmebank" not in public and "alpha" not in public
    assert 'toolrail_calls_total{outcome="succeeded",tool="mcp"} 1.0' in public, public[:3000]
    assert 'toolrail_calls_total{outcome="succeeded",tool="get_weather"} 1.0' in public
    assert 'toolrail_call_duration_seconds_count{tool="mcp"} 1.0' in public
    assert f'tool="{PRIVATE}"' in keyed  # the operator's scrape still sees every tool


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver(status=204) as rec:
        yield rec


def test_the_webhook_worker_logs_no_full_url(receiver: Receiver, worker_env: dict[str, str], tmp_path: Path) -> None:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail.settings import Settings
    from tools.registry import default_registry

    hook_url = receiver.url(f"/{SECRET_PATH}/events?token={SECRET_QUERY}")
    db_url = own_database(f"{__name__}:webhooks")
    log_file = tmp_path / "worker.log"
    env = {**os.environ, **worker_env, "REDIS_URL": db_url, "TOOLRAIL_LOG_LEVEL": "INFO",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
    queues = ",".join(["decide", "webhooks", *default_registry().queues()])
    with open(log_file, "ab") as out:  # the worker as `toolrail worker` runs it: --loglevel INFO
        proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "executor.worker.celery", "worker", "-Q", queues,
                                 "-c", "1", "--pool", "prefork", "-n", "toolrail-trust-logs@%h", "--without-gossip",
                                 "--without-mingle", "--loglevel", "INFO"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    settings = Settings(rate_limit_per_s=0, reconcile_interval_s=0, webhook_allow_private=True)
    runtime = Runtime.from_settings(settings, redis_url=db_url)
    enqueue, rerun = publishers(db_url)
    try:
        with api_server(create_app(settings, runtime, enqueue=enqueue, rerun=rerun,
                                   ping_workers=lambda: 1, mount_openai=False)) as base:
            wait_for_workers(db_url, count=1, timeout_s=90)
            with httpx.Client(base_url=base, timeout=30) as client:
                response = client.post("/v1/jobs", json={"webhook_url": hook_url, "tools": ["get_weather"],
                                                         "tool_calls": [{"name": "get_weather", "arguments": {
                                                             "city": "Oslo", "date": "today"}}]})
                assert response.status_code == 202, response.text
                job = wait_for_job(client, response.json()["job_id"], timeout_s=90)
                assert job["status"] == "succeeded", job
                paths = wait_for(lambda: [r["path"] for r in receiver.seen()], 30)
                seen = client.get(f"/v1/jobs/{job['job_id']}").json().get("webhooks")
            assert all(SECRET_QUERY in p for p in paths), (seen, log_file.read_text()[-1500:])
            time.sleep(1.0)  # the worker's last lines
    finally:
        stop_process(proc)
    text = log_file.read_text(errors="replace")
    assert "webhook.attempt" in text  # the worker logged its deliveries at INFO ...
    assert SECRET_PATH not in text and SECRET_QUERY not in text, [l for l in text.splitlines() if SECRET_QUERY in l][:3]
