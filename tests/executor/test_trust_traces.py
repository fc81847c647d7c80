"""Trace ids are per tenant (issue 25, item 6): a client's ``traceparent`` never opens another tenant's trace.

Tenant alpha runs a job in trace T (its own ``traceparent``). Tenant beta then sends a job with the
same trace id (and a forged ``toolrail.tenant=alpha`` baggage entry): beta's job starts a new trace
whose job span links to beta's parent in T, and ``GET /v1/jobs/<beta's job>/trace`` holds beta's
spans only; alpha's trace holds alpha's only. Real stack: the API in this process exporting to Redis,
a real Celery worker (its spans, the sandbox child's) exporting to the same Redis.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from executor.worker.config import worker_queues
from tests.harness.jobs import publishers
from tests.harness.serving import worker_pool

from executor.job_client import wait_for_job

KEYS = {"alpha": "key-trace-alpha", "beta": "key-trace-beta"}
WEATHER = {"tools": ["get_weather"], "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo", "date": "today"}}]}


@pytest.fixture(scope="module")
def traced_worker(db_url: str, worker_env: dict[str, str], tmp_path_factory) -> Iterator[object]:
    from tools.registry import default_registry

    env = {**worker_env, "TOOLRAIL_TRACE_STORE": "redis"}
    log = tmp_path_factory.mktemp("trust-traces") / "worker.log"
    with worker_pool(db_url, queues=worker_queues(default_registry()), concurrency=1, env=env, log_file=log,
                     hostname="toolrail-trust-traces@%h") as proc:
        yield proc


@pytest.fixture(scope="module")
def api(db_url: str, traced_worker) -> Iterator[tuple[str, Any]]:
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail import tracing
    from toolrail.settings import Settings
    from toolrail.trace_sinks import RedisSpanExporter

    settings = Settings(api_keys=",".join(f"{k}:{t}" for t, k in KEYS.items()), trace_store="redis", rate_limit_per_s=0,
                        reconcile_interval_s=0)
    runtime = Runtime.from_settings(settings, redis_url=db_url)
    tracing.setup("api", settings=settings, exporters=[RedisSpanExporter(runtime.redis)])
    enqueue, rerun = publishers(db_url)
    with api_server(create_app(settings, runtime, enqueue=enqueue, rerun=rerun,
                               ping_workers=lambda: 1, mount_openai=False)) as base:
        yield base, runtime


def _client(base: str, tenant: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {KEYS[tenant]}"})


def _flush() -> None:
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "force_flush"):
        provider.force_flush()


def _run(client: httpx.Client, headers: dict[str, str]) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=WEATHER, headers=headers)
    assert response.status_code == 202, response.text
    job = wait_for_job(client, response.json()["job_id"], timeout_s=90)
    assert job["status"] == "succeeded", job
    return job


def _trace(client: httpx.Client, job_id: str) -> dict[str, Any]:
    """The job's trace once its job span and its sandbox span arrived (spans come in batches)."""
    deadline = time.monotonic() + 30
    while True:
        _flush()
        body = client.get(f"/v1/jobs/{job_id}/trace").json()
        names = {s["name"] for s in body["spans"]}
        if ("job" in names and any(n.startswith("sandbox ") for n in names)) or time.monotonic() > deadline:
            return body
        time.sleep(0.3)


def test_a_trace_id_reused_by_another_tenant_shows_it_none_of_the_first_tenants_spans(api) -> None:
    base, runtime = api
    trace_id = secrets.token_hex(16)
    with _client(base, "alpha") as alpha, _client(base, "beta") as beta:
        a_job = _run(alpha, {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
        a_trace = _trace(alpha, a_job["job_id"])
        a_spans = a_trace["spans"]
        assert a_trace["trace_id"] == trace_id  # the first tenant's own traceparent is honoured
        assert {"job", "POST /v1/jobs"} <= {s["name"] for s in a_spans} and len(a_spans) >= 5, [s["name"] for s in a_spans]
        assert {s["attributes"].get("toolrail.tenant") for s in a_spans} == {"alpha"}

        b_parent = secrets.token_hex(8)
        b_job = _run(beta, {"traceparent": f"00-{trace_id}-{b_parent}-01", "baggage": "toolrail.tenant=alpha"})
        b_trace = _trace(beta, b_job["job_id"])
        b_spans = b_trace["spans"]
        leaked = {s["span_id"] for s in a_spans} & {s["span_id"] for s in b_spans}
        assert not leaked, f"{len(leaked)} of alpha's spans in beta's trace"
        assert not [s for s in b_spans if s["attributes"].get("toolrail.tenant") != "beta"], b_spans
        assert b_trace["trace_id"] != trace_id  # a new trace ...
        (b_job_span,) = [s for s in b_spans if s["name"] == "job"]
        (link,) = b_job_span["links"]  # ... linked to beta's own POST span in the foreign trace (a child of b_parent)
        assert link["trace_id"] == trace_id and link["span_id"] not in {s["span_id"] for s in a_spans}
        assert any(s["name"].startswith("sandbox ") for s in b_spans)  # beta's own spans are all there

        again = alpha.get(f"/v1/jobs/{a_job['job_id']}/trace").json()["spans"]
        assert {s["attributes"].get("toolrail.tenant") for s in again} == {"alpha"}  # the forged baggage got nowhere
        # alpha's spans still there (more may have arrived since: spans come in batches), none of beta's
        assert {s["span_id"] for s in a_spans} <= {s["span_id"] for s in again}
        assert not {s["span_id"] for s in again} & {s["span_id"] for s in b_spans}
    assert runtime.redis.get(f"tr:trace-owner:{trace_id}") == b"alpha"
