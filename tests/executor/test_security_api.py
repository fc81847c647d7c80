"""Hostile clients and tenants against the real API over the session's real Redis (issue 18).

Findings 1, 2 and 4 as regression tests: a backtracking pattern is answered in bounded time
while ``/healthz`` stays fast; schemas that could never finish (recursive ``$ref``, patterns RE2
cannot run, oversized) are refused at submit with the path; the OpenAI endpoint and
``/metrics`` sit behind the same tenancy as the rest; event streams are coroutines that end on
disconnect, send heartbeats and are capped per tenant; and one tenant's crashing calls open only
its own circuit breaker.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from tests.harness.jobs import wait_terminal
from fastapi.testclient import TestClient

from executor.api.app import create_app
from tests.harness.fixtures import API_KEYS, METRICS_KEY
from tests.harness.serving import api_server
from executor.store.records import JobRecord
from toolrail.settings import Settings

ALPHA = {"Authorization": "Bearer key-alpha-18"}
BETA = {"Authorization": "Bearer key-beta-18"}
EVIL = r"^(a+)+$"


def _tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "lookup_code", "description": "look a code up",
                                             "parameters": parameters}}


RECURSIVE = {"type": "object", "properties": {"node": {"$ref": "#/$defs/node"}},
             "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}}}


class HealthProbe:
    """Polls ``/healthz`` on its own connection in a thread; keeps every latency."""

    def __init__(self, base_url: str, every_s: float = 0.02) -> None:
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base_url, every_s), daemon=True)

    def _run(self, base_url: str, every_s: float) -> None:
        with httpx.Client(base_url=base_url, timeout=10) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                self.latencies.append(time.perf_counter() - started)
                self._stop.wait(every_s)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


# ----------------------------------------------------------------- patterns and schemas at submit


def test_backtracking_pattern_is_answered_in_bounded_time_while_healthz_stays_fast(client: httpx.Client,
                                                                                   api: str) -> None:
    body = {"tools": [_tool({"type": "object", "properties": {"code": {"type": "string", "pattern": EVIL}},
                             "required": ["code"]})],
            "tool_calls": [{"name": "lookup_code", "arguments": {"code": "a" * 5_000 + "!"}}]}
    with HealthProbe(api) as probe:
        started = time.monotonic()
        created = client.post("/v1/jobs", json=body)
        elapsed = time.monotonic() - started
        time.sleep(0.3)
    assert created.status_code == 422, created.text  # the client's own call, checked at submit: refused, not stored
    assert "does not match" in created.text, created.text  # the pattern was checked (RE2), and failed, not skipped
    assert elapsed < 30
    assert len(probe.latencies) >= 5 and max(probe.latencies) < 0.1, max(probe.latencies)


@pytest.fixture(scope="module")
def tenant_app(runtime) -> Iterator[TestClient]:
    settings = Settings(api_keys=API_KEYS, metrics_key=METRICS_KEY, max_schema_bytes=8_192)
    with TestClient(create_app(settings, runtime, enqueue=lambda job: None, ping_workers=lambda: 1,
                               mount_openai=True), raise_server_exceptions=False) as app_client:
        yield app_client


@pytest.mark.parametrize(("parameters", "type_", "path", "reason"), [
    (RECURSIVE, "schema_rejected", "/tools/0/function/parameters/$defs/node/properties/child/$ref", "recursive_ref"),
    ({"type": "object", "properties": {"me": {"$ref": "#"}}}, "schema_rejected",
     "/tools/0/function/parameters/properties/me/$ref", "recursive_ref"),
    ({"type": "object", "properties": {"x": {"$ref": "https://evil.example/schema.json"}}}, "schema_rejected",
     "/tools/0/function/parameters/properties/x/$ref", "remote_ref"),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": r"^(\d)\1$"}}}, "unsupported_pattern",
     "/tools/0/function/parameters/properties/code/pattern", "backreference"),
    ({"type": "object", "description": "x" * 9_000}, "schema_rejected", "/tools/0/function/parameters", "too_large"),
])
def test_unsafe_schemas_are_refused_at_submit_before_anything_is_stored(tenant_app: TestClient, parameters: dict,
                                                                         type_: str, path: str, reason: str) -> None:
    before = tenant_app.get("/v1/jobs", headers=ALPHA).json()["jobs"]
    response = tenant_app.post("/v1/jobs", headers=ALPHA, json={
        "tools": [_tool(parameters)], "tool_calls": [{"name": "lookup_code", "arguments": {}}]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == type_ and error["details"]["path"] == path and reason in error["details"]["reason"]
    assert tenant_app.get("/v1/jobs", headers=ALPHA).json()["jobs"] == before  # nothing stored
    chat = tenant_app.post("/v1/chat/completions", headers=ALPHA, json={
        "messages": [{"role": "user", "content": "hi"}], "tools": [_tool(parameters)]})
    assert chat.status_code == 422, chat.text
    assert chat.json()["error"]["code"] == type_ and chat.json()["error"]["details"]["path"] == path


# ----------------------------------------------------------------- one tenancy for every endpoint


def test_openai_endpoint_requires_a_key_and_caps_max_tokens(tenant_app: TestClient) -> None:
    ask = {"messages": [{"role": "user", "content": "count to a million"}], "max_tokens": 10**30}
    for headers in ({}, {"Authorization": "Bearer nope"}):
        response = tenant_app.post("/v1/chat/completions", json=ask, headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["error"]["type"] == "unauthorized"
    capped = tenant_app.post("/v1/chat/completions", json=ask, headers=ALPHA)  # past any context: refused, not clamped
    assert capped.status_code == 400, capped.text
    error = capped.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "integer_out_of_range"
    assert error["param"] == "max_tokens"
    assert tenant_app.post("/v1/chat/completions", headers=ALPHA, json={
        **ask, "max_tokens": None, "max_completion_tokens": 0}).json()["error"]["param"] == "max_completion_tokens"


def test_openai_endpoint_gets_the_tenants_rate_limit(runtime) -> None:
    settings = Settings(api_keys=API_KEYS, rate_limit_per_s=0.5, rate_limit_burst=2)
    runtime.redis.delete("tr:rl:alpha", "tr:rl:beta")
    with TestClient(create_app(settings, runtime, enqueue=lambda job: None, mount_openai=True),
                    raise_server_exceptions=False) as app_client:
        over_cap = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9_000}  # past the context: refused first
        statuses = [app_client.post("/v1/chat/completions", json=over_cap, headers=ALPHA).status_code for _ in range(3)]
        assert statuses == [400, 400, 429]
        assert app_client.post("/v1/chat/completions", json=over_cap, headers=BETA).status_code == 400
    runtime.redis.delete("tr:rl:alpha", "tr:rl:beta")


def test_metrics_name_tenants_only_to_the_metrics_key(tenant_app: TestClient) -> None:
    weather = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]}
    assert tenant_app.post("/v1/jobs", headers=ALPHA, json=weather).status_code == 202  # jobs_created{tenant="alpha"}
    public = tenant_app.get("/metrics")
    assert public.status_code == 200
    assert "alpha" not in public.text and "beta" not in public.text
    assert "toolrail_http_request_duration_seconds_count" in public.text
    for wrong in ({"Authorization": "Bearer key-alpha-18"}, {"Authorization": "Bearer nope"}):
        assert "alpha" not in tenant_app.get("/metrics", headers=wrong).text  # a tenant key shows no tenant
    operator = tenant_app.get("/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}).text
    assert 'toolrail_jobs_created_total{tenant="alpha"}' in operator
    assert "toolrail_jobs_created_total " in public.text  # the same series, summed over tenants


# ----------------------------------------------------------------- event streams


def _open_stream_gauge(base: str) -> float:
    scrape = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}, timeout=5).text
    for line in scrape.splitlines():
        if line.startswith('toolrail_sse_open_streams{tenant="alpha"}'):
            return float(line.split()[-1])
    return 0.0


def _endless_job(runtime, tenant: str) -> str:
    """A job nobody works on: its event stream never reaches a terminal status."""
    job, _ = runtime.store.create(JobRecord(job_id=f"job_sse{time.time_ns()}", request_id="req-sse", tenant=tenant,
                                            messages=[{"role": "user", "content": "wait"}], tools=[]))
    return job.job_id


async def _open_streams(base: str, path: str, count: int, headers: dict) -> tuple[list, list, httpx.AsyncClient]:
    client = httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(30, read=30),
                               limits=httpx.Limits(max_connections=count + 10))
    contexts = [client.stream("GET", path, headers=headers) for _ in range(count)]
    responses = await asyncio.gather(*(c.__aenter__() for c in contexts))
    return contexts, responses, client


def test_100_open_streams_leave_healthz_answering_and_end_on_disconnect(api_process: tuple[int, int], runtime) -> None:
    base = f"http://127.0.0.1:{api_process[0]}"  # ``toolrail serve --no-worker`` in its own process: the API as shipped
    job_id = _endless_job(runtime, "alpha")

    async def scenario() -> tuple[list[float], list[str], float]:
        contexts, responses, client = await _open_streams(base, f"/v1/jobs/{job_id}/events?timeout_s=120", 100, ALPHA)
        assert [r.status_code for r in responses] == [200] * 100
        first_lines, readers = [], [response.aiter_lines() for response in responses[:3]]  # kept: a dropped
        for lines in readers:  # reader closes its response
            first_lines += [await lines.__anext__() for _ in range(6)]
        latencies = []
        async with httpx.AsyncClient(base_url=base, timeout=5) as probe:
            await probe.get("/healthz")  # the connection, not the server, is what a first request times
            for _ in range(40):  # two seconds: two rounds of heartbeats
                started = time.perf_counter()
                assert (await probe.get("/healthz")).status_code == 200
                latencies.append(time.perf_counter() - started)
                await asyncio.sleep(0.05)
            assert (await probe.get(f"/v1/jobs/{job_id}", headers=ALPHA)).status_code == 200
        open_before = await asyncio.to_thread(_open_stream_gauge, base)
        for context in contexts:
            await context.__aexit__(None, None, None)
        await client.aclose()
        return latencies, first_lines, open_before

    latencies, first_lines, open_before = asyncio.run(scenario())
    assert open_before == 100
    assert ": stream open" in first_lines and any(line.startswith("event: status") for line in first_lines)
    # Before: 45 streams held every thread and /healthz timed out. Now the streams are coroutines; the bound
    # leaves room for a shared CI machine (measured on an idle one: median 15 ms, p95 23 ms, as with no stream).
    ordered = sorted(latencies)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    assert statistics.median(latencies) < 0.05 and p95 < 0.25, (statistics.median(latencies), p95, max(latencies))
    deadline = time.monotonic() + 5
    while _open_stream_gauge(base) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _open_stream_gauge(base) == 0  # every stream ended when its client went away
    assert httpx.get(f"{base}/healthz", timeout=2).status_code == 200


def test_open_streams_are_capped_per_tenant(runtime) -> None:
    settings = Settings(api_keys=API_KEYS, sse_heartbeat_s=0.2, sse_max_streams_per_tenant=2, rate_limit_per_s=0)
    app = create_app(settings, runtime, enqueue=lambda job: None, ping_workers=lambda: 1, mount_openai=False)
    with api_server(app) as base:
        alpha_job, beta_job = _endless_job(runtime, "alpha"), _endless_job(runtime, "beta")

        async def scenario() -> None:
            contexts, responses, client = await _open_streams(base, f"/v1/jobs/{alpha_job}/events", 2, ALPHA)
            assert [r.status_code for r in responses] == [200, 200]
            lines = responses[0].aiter_lines()
            assert [await lines.__anext__() for _ in range(8)][-2:] == [": heartbeat", ""]  # after the status event
            third = await client.get(f"/v1/jobs/{alpha_job}/events", headers=ALPHA)
            assert third.status_code == 429 and third.json()["error"]["type"] == "too_many_streams"
            async with client.stream("GET", f"/v1/jobs/{beta_job}/events", headers=BETA) as beta:
                assert beta.status_code == 200  # another tenant's streams are its own
            await contexts[0].__aexit__(None, None, None)
            for _ in range(50):
                if app.state.stream_slots.open("alpha") < 2:
                    break
                await asyncio.sleep(0.05)
            async with client.stream("GET", f"/v1/jobs/{alpha_job}/events", headers=ALPHA) as again:
                assert again.status_code == 200  # the closed stream gave its slot back
            await contexts[1].__aexit__(None, None, None)
            await client.aclose()

        asyncio.run(scenario())


# ----------------------------------------------------------------- circuit breakers per tenant


def test_one_tenants_crashing_calls_do_not_open_the_breaker_for_others(runtime, worker) -> None:
    breaker = runtime.breaker
    breaker.reset("stress")
    crash = {"tool_calls": [{"name": "stress", "arguments": {"mode": "crash"}}]}
    fine = {"tool_calls": [{"name": "stress", "arguments": {"mode": "ok"}}]}
    with TestClient(create_app(Settings(api_keys=API_KEYS, rate_limit_per_s=0), runtime, mount_openai=False),
                    raise_server_exceptions=False) as app_client:
        def run(body: dict, headers: dict) -> dict:
            created = app_client.post("/v1/jobs", json=body, headers=headers)
            assert created.status_code == 202, created.text
            return _finished(app_client, created, headers)
        try:
            for _ in range(breaker.failures):
                assert run(crash, ALPHA)["calls"][0]["error"]["type"] == "tool_crashed"
            assert breaker.state("stress", "alpha")["state"] == "open"
            assert run(fine, ALPHA)["calls"][0]["error"]["type"] == "circuit_open"
            beta = run(fine, BETA)
            assert beta["status"] == "succeeded", beta  # beta's breaker never saw alpha's crashes
            assert breaker.state("stress", "beta")["state"] == "closed"
            metrics = app_client.get("/metrics").text
            assert 'toolrail_breaker_state{tool="stress"} 2.0' in metrics
            assert 'toolrail_breaker_open_tenants{tool="stress"} 1.0' in metrics
            assert "alpha" not in metrics
        finally:
            breaker.reset("stress")


def _finished(app_client: TestClient, created: httpx.Response, headers: dict) -> dict:
    from executor.job_client import wait_for_job
    from executor.store.records import TERMINAL_JOB

    job = wait_for_job(app_client, created.json()["job_id"], timeout_s=60, headers=headers)
    assert job["status"] in TERMINAL_JOB, job
    return job
