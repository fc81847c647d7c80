"""Seams under a real ``toolrail serve`` — its own Redis, its own supervised worker pool, nothing faked.

- a job's webhook is delivered to a receiver on loopback, signed as Standard Webhooks' reference library checks;
- a decide step whose decider raises a bug (``TypeError``) ends its job ``failed`` with ``internal_error``
  carrying the request id, within seconds (it used to stay ``deciding`` for ever);
- the Celery main process and its pool processes SIGKILLed while 30 jobs are submitted: serve restarts the pool
  (``/readyz`` answers 503 ``worker_down`` meanwhile) and all 30 end ``succeeded``;
- the pool warms its decider at start, and serve is ready only after.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from executor.job_client import wait_for_job
from executor.stack import wait_http_ok
from tests.harness.receiver import Receiver, wait_for
from toolrail.redis_embed import EmbeddedRedis, free_port

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"serve-seams-webhook-key-01234567").decode()
WEATHER = {"name": "get_weather", "arguments": {"city": "Beijing", "date": "tomorrow"}}


def raising_decider(settings: object) -> object:
    """The serve's ``TOOLRAIL_DECIDER_FACTORY``: a decider that cannot be built, by a bug."""
    raise TypeError("unhashable type: 'dict' (a decider factory with a bug)")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _celery_main(serve_pid: int) -> int | None:
    for child in _children(serve_pid):
        try:
            if b"celery" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:
            continue
    return None


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """``toolrail serve`` with its worker pool (no ``--no-worker``) on a Redis of its own."""
    redis_server = EmbeddedRedis(data_dir=tmp_path_factory.mktemp("serve-redis")).start()
    port = free_port()
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    env = {**os.environ, "TOOLRAIL_DECIDER": "custom",
           "TOOLRAIL_DECIDER_FACTORY": "tests.executor.test_serve_seams:raising_decider",
           # unacked messages of a killed pool come back after this (late acks): short, for the test's sake
           "TOOLRAIL_VISIBILITY_TIMEOUT_S": "20", "TOOLRAIL_RECONCILE_INTERVAL_S": "5",
           "TOOLRAIL_WEBHOOK_ALLOW_PRIVATE": "1", "TOOLRAIL_WEBHOOK_SECRET": WEBHOOK_SECRET,
           "TOOLRAIL_WEBHOOK_BACKOFF_S": "0.2", "TOOLRAIL_LOG_JSON": "1", "TOOLRAIL_RATE_LIMIT_PER_S": "0",
           "PYTHONPATH": str(REPO)}
    env.pop("REDIS_URL", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port), "--redis-url",
                                 redis_server.url, "--concurrency", "2"], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not _ready(base):
            assert proc.poll() is None, f"serve exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"serve not ready in 120 s: {log.read_text()[-3000:]}"
            time.sleep(0.3)
        yield base, proc, log
    finally:
        main = _celery_main(proc.pid)
        seen.update(p for p in [main, *(_children(main) if main else [])] if p)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in seen:  # a pool serve could not stop
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        redis_server.stop()


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_webhook_is_delivered_under_serve(serve: tuple[str, subprocess.Popen, Path]) -> None:
    from standardwebhooks.webhooks import Webhook

    base, _, _ = serve
    with Receiver(status=204) as receiver:
        with httpx.Client(base_url=base, timeout=30) as client:
            created = client.post("/v1/jobs", json={"tool_calls": [WEATHER], "tools": ["get_weather"],
                                                    "webhook_url": receiver.url("/hook")})
            assert created.status_code == 202, created.text
            job = wait_for_job(client, created.json()["job_id"], timeout_s=60)
            assert job["status"] == "succeeded", job
            assert job["deadline_at"] > job["created_at"]  # set by the one submit (MCP's: tests/mcpbridge)

            def succeeded() -> list[dict]:
                payloads = [Webhook(WEBHOOK_SECRET).verify(r["body"], r["headers"])  # raises on a bad signature
                            for r in receiver.seen("/hook")]
                return [p for p in payloads if p["type"] == "job.succeeded"]

            (payload,) = wait_for(succeeded, 30)
            assert payload["data"]["job_id"] == job["job_id"]
            checks = client.get("/readyz").json()["checks"]
            assert checks["workers"] >= 1 and "queues_without_workers" not in checks, checks  # webhooks consumed
            wait_for(lambda: any(d["event"] == "job.succeeded" and d["state"] == "delivered"  # said a moment later
                                 for d in client.get(f"/v1/jobs/{job['job_id']}").json()["webhooks"]), 10)


def test_a_decide_step_that_raises_ends_its_job_failed(serve: tuple[str, subprocess.Popen, Path]) -> None:
    base, _, _ = serve
    with httpx.Client(base_url=base, timeout=30) as client:
        created = client.post("/v1/jobs", json={"messages": [{"role": "user", "content": "weather in Beijing?"}],
                                                "tools": ["get_weather"]}, headers={"X-Request-ID": "req-raises-1"})
        assert created.status_code == 202, created.text
        started = time.monotonic()
        job = wait_for_job(client, created.json()["job_id"], timeout_s=30)
    took = time.monotonic() - started
    assert job["status"] == "failed", job
    assert job["error"]["type"] == "internal_error" and job["error"]["details"]["request_id"] == "req-raises-1", job
    assert job["error"]["details"]["exception"] == "TypeError" and "Traceback" not in json.dumps(job["error"])
    assert took < 15, f"took {took:.1f} s"


def test_the_pool_warms_its_decider_at_start_and_readiness_waited(serve: tuple[str, subprocess.Popen, Path]) -> None:
    _, _, log = serve
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    warm = [line for line in lines if line.get("event") == "decider.warm"]
    assert warm and warm[0]["error"] == "TypeError", warm  # loaded at pool start (this factory fails: typed, logged)
    events = [line.get("event") for line in lines]
    assert events.index("decider.warm") < events.index("worker.answering")  # the pool counted as up once warm


def test_readiness_says_worker_down_while_the_supervisor_marks_it(redis_client) -> None:  # noqa: ANN001
    from executor.api.readiness import Readiness, mark_worker_down

    readiness = Readiness(redis_client, ping_workers=lambda: 1)
    assert readiness.check()[0] is True
    mark_worker_down(redis_client, {"reason": "worker_down", "pid": 1, "returncode": -9})
    try:
        ready, body = readiness.check()
        assert ready is False and body["reason"] == "worker_down" and body["waiting_for"] == ["workers"], body
        assert body["checks"]["worker_pool"]["returncode"] == -9
    finally:
        mark_worker_down(redis_client, None)
    assert readiness.check()[0] is True


def test_readiness_names_the_queues_no_worker_consumes(redis_client) -> None:  # noqa: ANN001
    from executor.api.readiness import Readiness
    from executor.worker.config import worker_queues
    from tools.registry import default_registry

    expected = worker_queues(default_registry())
    readiness = Readiness(redis_client, ping_workers=lambda: (1, {"decide", *default_registry().queues()}),
                          expected_queues=lambda: expected)
    ready, body = readiness.check()
    assert ready is True and body["checks"]["queues_without_workers"] == ["webhooks"], body  # reported, not waited for


def test_sigkilled_worker_under_serve_loses_no_job(serve: tuple[str, subprocess.Popen, Path]) -> None:
    base, proc, log = serve
    main = _celery_main(proc.pid)
    assert main is not None, "serve runs no Celery worker"
    pool = _children(main)
    ids: list[str] = []
    down_seen = threading.Event()
    stop = threading.Event()

    def watch_readiness() -> None:
        with httpx.Client(base_url=base, timeout=5) as probe:
            while not stop.is_set() and not down_seen.is_set():
                ready = probe.get("/readyz")
                if ready.status_code == 503 and ready.json().get("reason") == "worker_down":
                    down_seen.set()
                time.sleep(0.1)

    watcher = threading.Thread(target=watch_readiness, daemon=True)
    watcher.start()
    with httpx.Client(base_url=base, timeout=30) as client:
        for index in range(30):
            if index == 10:  # mid-submission: the main process and every pool process, no goodbye
                for pid in [main, *pool]:
                    os.kill(pid, signal.SIGKILL)
            created = client.post("/v1/jobs", json={"tool_calls": [{**WEATHER, "arguments": {
                "city": f"City{index}", "date": "today"}}], "tools": ["get_weather"]})
            assert created.status_code == 202, created.text
            ids.append(created.json()["job_id"])
        jobs = [wait_for_job(client, job_id, timeout_s=90) for job_id in ids]
        stop.set()
        statuses = [job["status"] for job in jobs]
        assert statuses.count("succeeded") == 30, f"{statuses}: {log.read_text()[-3000:]}"
        assert down_seen.is_set(), "/readyz never answered 503 worker_down while the pool was down"
        # ready again once the new pool answers a ping by its name: that can come a little after it took the jobs
        wait_http_ok(base, path="/readyz", timeout_s=20)
    new_main = _celery_main(proc.pid)
    assert new_main is not None and new_main != main
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    events = [line.get("event") for line in lines]
    assert "worker.died" in events and "worker.restarted" in events, events[-20:]


def test_a_worker_without_a_redis_url_exits_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "TOOLRAIL_REDIS_URL"}}
    done = subprocess.run([sys.executable, "-m", "toolrail.cli", "worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert "REDIS_URL" in lines[0] and "6379" not in lines[0]


def test_a_pool_that_refuses_to_start_is_not_restarted(tmp_path: Path) -> None:
    """Its tools cannot run (exit 78): starting it again cannot help; /readyz says why, for good."""
    import redis

    from executor.api.readiness import WORKER_DOWN_KEY
    from executor.stack import SupervisedWorker

    redis_server = EmbeddedRedis(data_dir=tmp_path).start()
    worker = SupervisedWorker(redis_server.url, concurrency=1, poll_s=0.2, backoff_s=0.2,
                              env={"TOOLRAIL_TOOL_MODULES": "tests.executor.no_such_tools_module"}).start()
    try:
        client = redis.Redis.from_url(redis_server.url)
        deadline = time.monotonic() + 60
        while (mark := client.get(WORKER_DOWN_KEY)) is None:
            assert time.monotonic() < deadline, "the refusal was never marked"
            time.sleep(0.2)
        assert json.loads(mark)["reason"] == "worker_refused_to_start" and json.loads(mark)["returncode"] == 78
        time.sleep(1.0)
        assert worker.restarts == 0 and worker.proc.poll() == 78
    finally:
        worker.stop()
        redis_server.stop()
