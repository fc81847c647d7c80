"""Faults against a whole toolrail of its own: redelivery timing, worker SIGKILLs, a Redis restart.

Short variants for the default run; ``bench/chaos.py`` runs 100+ kills. One stack (own
``redis-server``, API, two Celery workers with a 10 s visibility timeout) serves the module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from executor.worker.config import celery_config
from tests.chaos.chaos_harness import ChaosStack, run_chaos
from tests.chaos.hostile_tools import LINGER_SPEC

VISIBILITY_S = 10
#: ``alone``: its bounds (redelivery within the visibility timeout, workers ready again after Redis comes back) are
#: timed, and they were missed under the load of a parallel run.
pytestmark = pytest.mark.alone


@pytest.fixture(scope="module")
def stack() -> Iterator[ChaosStack]:
    chaos = ChaosStack(workers=2, concurrency=2, visibility_timeout_s=VISIBILITY_S).start()
    yield chaos
    chaos.stop()


def test_long_call_is_not_redelivered_while_it_runs(stack: ChaosStack) -> None:
    config = celery_config(stack.redis_url, visibility_timeout_s=VISIBILITY_S)
    # the invariant the config enforces: tool timeout < soft < hard time limit < visibility timeout
    assert LINGER_SPEC.timeout_s < config["task_soft_time_limit"] < config["task_time_limit"] < VISIBILITY_S
    assert config["broker_transport_options"]["unacked_restore_interval"] <= 1  # sweeps that would catch a redelivery
    client = redis.Redis.from_url(stack.redis_url)
    tag = f"long-{time.time_ns()}"
    seconds = 5.5  # over half the visibility timeout, with idle workers and a restore sweep every second
    with httpx.Client(base_url=stack.api_url, timeout=10) as api:
        job_id = api.post("/v1/jobs", json={"tool_calls": [{"name": "linger", "arguments": {"seconds": seconds, "tag": tag}}]}
                          ).json()["job_id"]
        deadline = time.monotonic() + 15
        unacked_seen = 0
        while time.monotonic() < deadline:
            job = api.get(f"/v1/jobs/{job_id}").json()
            if job["calls"] and job["calls"][0]["status"] == "running":
                unacked_seen = max(unacked_seen, client.hlen("unacked"))
            if job["status"] in {"succeeded", "failed"}:
                break
            time.sleep(0.25)
        assert job["status"] == "succeeded", job
        assert unacked_seen >= 1  # late ack: the message stayed unacked while the call ran
        time.sleep(VISIBILITY_S / 2)  # give any stray redelivery time to show
    assert int(client.get(f"chaos:linger:{tag}")) == 1
    assert job["calls"][0]["attempts"] == 1 and job["calls"][0]["duration_s"] >= seconds
    assert client.hlen("unacked") == 0


def test_worker_sigkills_lose_and_double_nothing(stack: ChaosStack) -> None:
    # five kills, main processes and pool processes both (bench/chaos.py runs 100+; test_worker_liveness proves each
    # kind resumes within seconds under serve)
    figures = run_chaos(stack, kills=5, kill_every_s=2.0, jobs_per_s=4, drain_timeout_s=60, main_share=0.35)
    print("chaos figures:", figures)
    assert figures["kills"] == 5 and figures["main_kills"] >= 1 and figures["pool_child_kills"] >= 1, figures
    assert figures["jobs"] >= 10, figures
    assert figures["lost"] == 0, figures
    assert figures["duplicated"] == 0 and figures["missing_applications"] == 0 and figures["orphaned"] == 0, figures
    assert figures["balances_exact"] and figures["total_conserved"], figures
    assert figures["succeeded"] == figures["jobs"], figures


def test_redis_restart_mid_run(stack: ChaosStack) -> None:
    outage: dict[str, list] = {"statuses": [], "types": []}

    def probe() -> dict:
        with httpx.Client(base_url=stack.api_url, timeout=10) as api:
            for method, path, body in [("POST", "/v1/jobs", {"tool_calls": []}), ("GET", "/v1/jobs", None),
                                       ("GET", "/v1/jobs/job_abc", None)]:
                response = api.request(method, path, json=body)
                outage["statuses"].append(response.status_code)
                outage["types"].append(response.json()["error"]["type"])
        return outage

    import random

    rng = random.Random(11)
    baseline = stack.balances()
    submitted = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=stack.api_url, timeout=10) as api:
            while not stop.is_set():
                item = stack.submit_transfer(api, rng)
                if item is not None:
                    submitted.append(item)
                time.sleep(0.25)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    time.sleep(3)
    stack.restart_redis(down_s=3, during_outage=probe)
    time.sleep(4)
    stop.set()
    loader.join(timeout=60)
    assert outage["statuses"] == [503, 503, 503], outage
    assert set(outage["types"]) == {"unavailable"}
    with httpx.Client(base_url=stack.api_url, timeout=10) as api:
        deadline = time.monotonic() + 60  # workers re-answer their ping once they reconnect to the new Redis
        while api.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        ready = api.get("/readyz")
        assert ready.status_code == 200, ready.text
        jobs = stack.wait_all_terminal(api, [s.job_id for s in submitted], timeout_s=60)
    figures = stack.verify(submitted, jobs, baseline=baseline)
    print("redis restart figures:", figures)
    assert figures["jobs"] >= 8 and figures["lost"] == 0, figures
    assert figures["duplicated"] == 0 and figures["missing_applications"] == 0, figures
    assert figures["balances_exact"] and figures["total_conserved"], figures
