"""Load control on real Redis and real workers: rate limits (429 + Retry-After), circuit
breakers (open, fail fast, half-open, close), adaptive concurrency, and 503 — never 500 —
when Redis is unreachable.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from tests.harness.jobs import wait_terminal
from fastapi.testclient import TestClient

from executor.api.app import create_app
from executor.calls.breaker import CircuitBreaker
from executor.calls.concurrency import ConcurrencyLimitedError, ConcurrencyLimiter
from executor.api.ratelimit import RateLimiter
from executor.runtime import Runtime
from toolrail.redis_embed import free_port
from toolrail.settings import Settings

WEATHER = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]}


def _app(runtime, **settings) -> TestClient:
    return TestClient(create_app(Settings(**settings), runtime, enqueue=lambda job: None, ping_workers=lambda: 1,
                                 mount_openai=False), raise_server_exceptions=False,
                      base_url="http://127.0.0.1")  # a loopback Host: a key-less API serves no other (LocalOnly)


# ----------------------------------------------------------------- rate limits


def test_bucket_refills_at_its_rate(redis_client: redis.Redis) -> None:
    limiter = RateLimiter(redis_client, rate_per_s=20, burst=5, prefix=f"test:rl:{time.time_ns()}")
    assert [limiter.acquire("t").allowed for _ in range(6)] == [True] * 5 + [False]
    denied = limiter.acquire("t")
    assert not denied.allowed and 0 < denied.retry_after_s <= 0.05 + 1e-6
    time.sleep(0.12)  # 20/s → two tokens back
    assert [limiter.acquire("t").allowed for _ in range(3)] == [True, True, False]
    assert limiter.acquire("other").allowed  # one bucket per tenant


def test_api_sheds_with_429_and_retry_after_per_tenant(runtime) -> None:
    with _app(runtime, api_keys="ka:alpha,kb:beta", rate_limit_per_s=2, rate_limit_burst=3, metrics_key="mk") as client:
        runtime.redis.delete("tr:rl:alpha", "tr:rl:beta")
        statuses = [client.get("/v1/jobs", headers={"X-API-Key": "ka"}).status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        limited = client.post("/v1/jobs", json=WEATHER, headers={"X-API-Key": "ka"})
        assert limited.status_code == 429
        assert int(limited.headers["Retry-After"]) >= 1
        body = limited.json()["error"]
        assert body["type"] == "rate_limited" and body["details"]["limit_per_s"] == 2
        assert client.get("/v1/jobs", headers={"X-API-Key": "kb"}).status_code == 200  # beta has its own bucket
        assert client.get("/healthz").status_code == 200  # ops endpoints are never limited
        metrics = client.get("/metrics", headers={"Authorization": "Bearer mk"}).text  # tenants: the operator's view
        assert 'toolrail_rate_limited_total{tenant="alpha"} 3.0' in metrics
        assert "alpha" not in client.get("/metrics").text  # the public scrape sums them away
        time.sleep(0.6)
        assert client.get("/v1/jobs", headers={"X-API-Key": "ka"}).status_code == 200


# ----------------------------------------------------------------- 503 when Redis is down


def test_redis_down_is_503_not_500() -> None:
    dead = Runtime.from_settings(Settings(), redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with _app(dead) as client:
        for method, path, kwargs in [("POST", "/v1/jobs", {"json": WEATHER}), ("GET", "/v1/jobs", {}),
                                     ("GET", "/v1/jobs/job_abc", {}), ("GET", "/v1/jobs/job_abc/events", {})]:
            response = client.request(method, path, **kwargs)
            assert response.status_code == 503, (method, path, response.status_code, response.text[:200])
            assert response.json()["error"]["type"] == "unavailable"
            assert response.headers["Retry-After"] == "1" and "Traceback" not in response.text
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 200


# ----------------------------------------------------------------- circuit breaker


def test_breaker_state_machine(redis_client: redis.Redis) -> None:
    breaker = CircuitBreaker(redis_client, failures=3, cooldown_s=0.3, prefix=f"test:breaker:{time.time_ns()}")
    for _ in range(2):
        breaker.record("t", ok=False)
    breaker.record("t", ok=True)  # consecutive failures only
    assert breaker.state("t")["state"] == "closed" and breaker.state("t")["failures"] == 0
    for _ in range(3):
        breaker.record("t", ok=False)
    assert breaker.state("t")["state"] == "open"
    assert breaker.admit("t", probe_ttl_s=5).state == "open"
    time.sleep(0.35)
    assert breaker.admit("t", probe_ttl_s=5).state == "probe"  # one probe after the cool-down
    assert breaker.admit("t", probe_ttl_s=5).state == "open"  # the others still fail fast
    breaker.record("t", ok=False)  # the probe failed: open again
    assert breaker.state("t") == {"state": "open", "failures": 4, "opens": 2}
    time.sleep(0.35)
    assert breaker.admit("t", probe_ttl_s=5).state == "probe"
    breaker.record("t", ok=True)
    assert breaker.state("t")["state"] == "closed" and breaker.admit("t", probe_ttl_s=5).state == "closed"


def test_breaker_opens_on_a_crashing_tool_and_fails_fast(client: httpx.Client, runtime) -> None:
    breaker = runtime.breaker
    breaker.reset("stress")
    crash = {"tool_calls": [{"name": "stress", "arguments": {"mode": "crash"}}]}
    try:
        for _ in range(breaker.failures):
            job = wait_terminal(client, client.post("/v1/jobs", json=crash).json()["job_id"])
            assert job["calls"][0]["error"]["type"] == "tool_crashed"
        assert breaker.state("stress")["state"] == "open"
        started = time.monotonic()
        fast = wait_terminal(client, client.post("/v1/jobs", json={"tool_calls": [
            {"name": "stress", "arguments": {"mode": "ok"}}]}).json()["job_id"])
        error = fast["calls"][0]["error"]
        assert fast["status"] == "failed" and error["type"] == "circuit_open", error
        assert error["details"]["tool"] == "stress" and error["details"]["retry_in_s"] > 0
        assert fast["calls"][0]["duration_s"] < 0.5 and time.monotonic() - started < 10
        assert fast["error"]["details"]["calls"][0]["error"]["type"] == "circuit_open"
        metrics = client.get("/metrics").text
        assert 'toolrail_breaker_state{tool="stress"} 2.0' in metrics
        assert 'toolrail_breaker_state{tool="get_weather"} 0.0' in metrics
        # other tools are unaffected
        assert wait_terminal(client, client.post("/v1/jobs", json=WEATHER).json()["job_id"])["status"] == "succeeded"
    finally:
        breaker.reset("stress")


def test_typed_tool_errors_do_not_trip_the_breaker(client: httpx.Client, runtime) -> None:
    breaker = runtime.breaker
    breaker.reset("transfer")
    body = {"tool_calls": [{"name": "transfer", "arguments": {"from_account": "nobody-here", "to": "bob", "amount": 1,
                                                               "currency": "CNY"}}]}
    for _ in range(breaker.failures + 1):
        job = wait_terminal(client, client.post("/v1/jobs", json=body).json()["job_id"])
        assert job["calls"][0]["error"]["type"] == "tool_input_error"  # the tool's own type, one level deep
    assert breaker.state("transfer")["state"] == "closed"


# ----------------------------------------------------------------- adaptive concurrency


@pytest.fixture()
def limiter(redis_client: redis.Redis) -> Iterator[ConcurrencyLimiter]:
    yield ConcurrencyLimiter(redis_client, initial=8, minimum=2, maximum=32, prefix=f"test:conc:{time.time_ns()}")


def test_limit_grows_while_latency_holds_and_falls_as_it_rises(limiter: ConcurrencyLimiter) -> None:
    for _ in range(40):
        limiter.record("q", 0.010)
    grown = limiter.state("q")["limit"]
    assert grown == 32  # steady latency: up to the maximum
    trace = [limiter.record("q", 0.010 * factor) for factor in (2, 4, 8, 8, 8, 8, 8, 8, 8, 8)]
    assert trace[-1] < grown / 2 and all(b <= a + 1e-9 for a, b in zip(trace[1:], trace[2:], strict=False))
    for _ in range(40):
        low = limiter.record("q", 0.5)
    assert low < 2.5  # down to the floor (2)
    for _ in range(200):
        recovered = limiter.record("q", 0.010)
    assert recovered > 16  # latency came back: so does concurrency


def test_slots_bound_in_flight_calls_and_leases_expire(limiter: ConcurrencyLimiter) -> None:
    for _ in range(30):
        limiter.record("q", 1.0)
    for _ in range(60):
        limiter.record("q", 10.0)
    limit = int(limiter.state("q")["limit"])
    assert 2 <= limit <= 4  # ten times slower: from 32 allowed down to a handful
    held = [limiter.acquire("q", lease_s=0.5, wait_s=0) for _ in range(limit)]
    with pytest.raises(ConcurrencyLimitedError) as info:
        limiter.acquire("q", lease_s=0.5, wait_s=0.1)
    assert info.value.details["in_flight"] == limit and info.value.details["retry_in_s"] > 0
    limiter.release(held[0])
    assert limiter.acquire("q", lease_s=0.5, wait_s=0) is not None
    time.sleep(0.6)  # a killed worker's slots come back when their lease runs out
    assert limiter.acquire("q", lease_s=5, wait_s=0) is not None and limiter.state("q")["in_flight"] == 1


def test_concurrency_state_in_metrics_after_real_calls(client: httpx.Client) -> None:
    job = wait_terminal(client, client.post("/v1/jobs", json=WEATHER).json()["job_id"])
    assert job["status"] == "succeeded"
    metrics = client.get("/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith('toolrail_concurrency_limit{queue="tool.get_weather"}'))
    assert float(line.split()[-1]) >= 4
    assert 'toolrail_concurrency_in_flight{queue="tool.get_weather"}' in metrics
    latency = next(x for x in metrics.splitlines()
                   if x.startswith('toolrail_concurrency_latency_seconds{queue="tool.get_weather"}'))
    assert float(latency.split()[-1]) > 0
