"""Operations: outcome metrics through real workers, a readiness that does not flap, the Redis
``serve`` uses, and one-line CLI errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import redis
from tests.harness.jobs import wait_terminal

from executor.api.readiness import Readiness
from toolrail.redis_embed import free_port

REPO = Path(__file__).resolve().parents[2]
ASK = {"role": "user", "content": "Weather in Oslo today, please; and run the stress tool: ok, then crash."}


def _sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()) and (labels or "{" not in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_job_and_call_outcomes_are_counted(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    calls = [{"name": "get_weather", "arguments": {"city": "Oslo", "date": "today"}},
             {"name": "stress", "arguments": {"mode": "ok"}}, {"name": "stress", "arguments": {"mode": "crash"}}]
    created = client.post("/v1/jobs", json={"messages": [ASK], "tools": ["get_weather", "stress"], "tool_calls": calls})
    assert created.status_code == 202, created.text
    job = wait_terminal(client, created.json()["job_id"])
    assert job["status"] == "failed", job
    assert job["decision_s"] is not None and job["decision_s"] >= 0
    after = client.get("/metrics").text

    def delta(name: str, **labels: str) -> float:
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert delta("toolrail_jobs_finished_total", status="failed") == 1
    assert delta("toolrail_calls_total", tool="get_weather", outcome="succeeded") == 1
    assert delta("toolrail_calls_total", tool="stress", outcome="succeeded") == 1
    assert delta("toolrail_calls_total", tool="stress", outcome="failed") == 1
    assert delta("toolrail_call_duration_seconds_count", tool="stress") == 2
    assert delta("toolrail_call_duration_seconds_bucket", tool="get_weather", le="+Inf") == 1
    assert delta("toolrail_call_duration_seconds_sum", tool="get_weather") > 0
    assert delta("toolrail_decisions_total", outcome="running") == 1
    assert delta("toolrail_decision_duration_seconds_count") >= 1
    assert "# TYPE toolrail_reasks_total counter" in after


def test_reasks_and_decision_time_come_from_the_job_record(runtime) -> None:
    """The store counts re-asks (attempts after the first) and times deciding → needs_review once."""
    from executor.metrics import OutcomeCollector
    from executor.store.models import Attempt
    from executor.store.records import JobRecord, RedisJobStore

    prefix = f"test:metrics:{time.time_ns()}"
    store = RedisJobStore(runtime.redis, prefix=prefix)
    job, _ = store.create(JobRecord(job_id="job_m1", request_id="r1", tenant="t"))

    def to(status: str, **fields):
        def mutate(record: JobRecord) -> None:
            record.status = status
            for key, value in fields.items():
                setattr(record, key, value)
        return mutate

    store.update("job_m1", to("deciding"))
    time.sleep(0.05)
    attempts = [Attempt(attempt=n, source="decider") for n in range(3)]  # as the decide step journals them
    done = store.update("job_m1", to("needs_review", attempts=attempts))
    store.update("job_m1", to("needs_review"))  # no status change: nothing counted again
    assert done.decision_s is not None and done.decision_s >= 0.05
    families = {f.name: f for f in OutcomeCollector(runtime.redis, prefix=prefix).collect()}
    assert [s.value for s in families["toolrail_reasks"].samples if s.name == "toolrail_reasks_total"] == [2]
    assert {(s.labels["status"], s.value) for s in families["toolrail_jobs_finished"].samples
            if s.name.endswith("_total")} == {("needs_review", 1)}
    count = [s.value for s in families["toolrail_decision_duration_seconds"].samples if s.name.endswith("_count")]
    assert count == [1]


# ----------------------------------------------------------------- readiness


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_readiness_says_what_it_waits_for_then_holds(redis_client: redis.Redis) -> None:
    answers = iter([0, 0, 1, 0, 0, 0, 0])
    clock = _Clock()
    ready = Readiness(redis_client, lambda: next(answers), probe_interval_s=1, workers_grace_s=10, clock=clock)
    ok, body = ready.check()
    assert not ok and body["status"] == "starting" and body["waiting_for"] == ["workers"]
    clock.now += 0.5
    assert ready.check()[1]["checks"]["workers"] == 0  # cached: no new probe inside the interval
    for _ in range(2):
        clock.now += 1
        ok, body = ready.check()
    assert ok and body["status"] == "ready" and "waiting_for" not in body
    for _ in range(4):  # workers miss pings for 8 s: still ready, within the grace
        clock.now += 2
        ok, body = ready.check()
        assert ok, body
        assert body["checks"]["workers"] == 0
    clock.now += 3  # 11 s since the last answer
    ok, body = ready.check()
    assert not ok and body["status"] == "not_ready" and body["waiting_for"] == ["workers"]


def test_readiness_reports_redis_down_at_once(redis_client: redis.Redis) -> None:
    dead = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    ok, body = Readiness(dead, lambda: 1).check()
    assert not ok and body["waiting_for"] == ["redis", "workers"] and body["checks"]["redis"].startswith("down")


def test_readyz_stays_200_under_concurrent_probes(api: str) -> None:
    """With the live worker pool: 4 pollers at once, 60 probes, never a 503 once ready (was 7 of 40 pings lost)."""
    with httpx.Client(base_url=api, timeout=10) as client:
        deadline = time.monotonic() + 30
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.2)
    statuses: list[int] = []

    def poll() -> None:
        with httpx.Client(base_url=api, timeout=10) as client:
            for _ in range(15):
                statuses.append(client.get("/readyz").status_code)
                time.sleep(0.05)

    threads = [threading.Thread(target=poll) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(statuses) == 60 and set(statuses) == {200}, statuses


# ----------------------------------------------------------------- serve's Redis and CLI errors


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run([sys.executable, "-m", "toolrail.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**base, **(env or {})}, timeout=timeout)


def test_run_against_a_down_api_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = _cli("run", "--url", url, "--tool-calls", '[{"name": "get_weather", "arguments": {}}]')
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(f"toolrail: cannot reach {url}/v1/jobs: ") and "toolrail serve" in run.stderr


def test_serve_with_a_down_redis_is_one_line() -> None:
    run = _cli("serve", "--no-worker", "--port", str(free_port()), "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if not line.startswith("{")]  # JSON log lines aside
    assert len(lines) == 1 and lines[0].startswith("toolrail: cannot reach Redis: redis://127.0.0.1:"), run.stderr


def _serve_until_listening(*args: str, env: dict[str, str] | None = None) -> list[dict]:
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--no-worker", "--port", str(free_port()), *args],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO,
                            env={**base, "TOOLRAIL_LOG_FORMAT": "json", "TOOLRAIL_DECIDER": "none", **(env or {})})
    events: list[dict] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("{"):
                events.append(json.loads(line))
                if events[-1].get("event") == "serve.listening":
                    break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return events


def test_serve_starts_its_own_redis_unless_one_is_named(redis_url: str, tmp_path: Path) -> None:
    embedded = next(e for e in _serve_until_listening(env={"TOOLRAIL_CACHE_DIR": str(tmp_path)}) if e["event"] == "serve.redis")
    assert embedded["source"] == "embedded"
    port = int(embedded["url"].rsplit(":", 1)[1].split("/")[0])
    assert port != 6379  # never whatever answers on the default port
    named = next(e for e in _serve_until_listening("--redis-url", redis_url) if e["event"] == "serve.redis")
    assert named == {**named, "source": "--redis-url", "url": redis_url}
    from_env = next(e for e in _serve_until_listening(env={"REDIS_URL": redis_url}) if e["event"] == "serve.redis")
    assert from_env["source"] == "REDIS_URL" and from_env["url"] == redis_url


def test_worker_concurrency_setting_reaches_the_worker_command(monkeypatch) -> None:
    import argparse

    from executor import serving

    seen: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda _file, argv: seen.append(argv))
    monkeypatch.setenv("TOOLRAIL_WORKER_CONCURRENCY", "7")
    from toolrail.settings import get_settings

    get_settings.cache_clear()
    try:
        serving.worker(argparse.Namespace(queues="decide", concurrency=None, loglevel="INFO"))
    finally:
        get_settings.cache_clear()
    argv = seen[0]
    assert argv[argv.index("-c") + 1] == "7"
    serving.worker(argparse.Namespace(queues="decide", concurrency=3, loglevel="INFO"))
    assert seen[1][seen[1].index("-c") + 1] == "3"


def test_ensure_redis_starts_on_a_free_port(tmp_path: Path) -> None:
    from toolrail.redis_embed import ensure_redis

    url, server = ensure_redis(None, tmp_path)
    try:
        assert server is not None and server.port != 6379 and url == server.url
        assert redis.Redis.from_url(url).ping()
    finally:
        if server:
            server.stop()
