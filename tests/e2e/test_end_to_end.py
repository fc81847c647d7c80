"""End to end on the embedded defaults: real SmolLM2 weights, real workers, real API, real CLI.

Marked ``model`` (not slow): CI runs these, so at least one job is decided by the real
model and executed through the whole platform on every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from test_demo import NOISE

from executor.job_client import wait_for_job
from executor.stack import LocalStack
from executor.store.records import TERMINAL_JOB
from executor.worker.config import DECIDER_WARM_KEY

#: ``alone``: its pool works the session broker's queues (the API it starts in-process publishes through the Celery
#: app, bound to the session's database), so no decider-less pool of the session may be up in the same process.
pytestmark = [pytest.mark.model, pytest.mark.alone]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Its worker pool started as the demo starts it (``start_worker``: the embedded decider, warmed at start, warnings
    only), its output kept in ``log_file``."""
    redis.Redis.from_url(os.environ["REDIS_URL"]).delete(DECIDER_WARM_KEY)  # an earlier pool's mark says nothing of this one
    with LocalStack(redis_url=os.environ["REDIS_URL"], concurrency=1, log_file=tmp_path_factory.mktemp("e2e") / "worker.log",
                    worker_env={"TOOLRAIL_DECIDER": "embedded", "TOOLRAIL_LOG_JSON": "1",
                                "TOOLRAIL_LOG_LEVEL": "WARNING"}) as running:
        yield running


def _wait(client: httpx.Client, job_id: str, timeout_s: float = 300) -> dict:
    job = wait_for_job(client, job_id, timeout_s=timeout_s, poll_s=0.25)
    assert job["status"] in TERMINAL_JOB, f"job {job_id} did not finish: {job}"
    return job


def test_a_deciding_worker_starts_quietly(stack: LocalStack) -> None:
    """The demo's worker pool (embedded decider, warmed at start), run as root as the demo runs it: no Celery
    ``SecurityWarning``, no transformers progress bar or warning, from start to a warm decider."""
    assert stack.log_file is not None
    client, deadline = redis.Redis.from_url(stack.redis_url), time.monotonic() + 300
    while not client.exists(DECIDER_WARM_KEY):
        assert time.monotonic() < deadline, stack.log_file.read_text()[-3000:]
        time.sleep(0.5)
    noise = [line for line in stack.log_file.read_text().splitlines() if NOISE.search(line)]
    assert not noise, "\n".join(noise)


def test_cli_run_decides_and_executes_on_the_real_model(stack: LocalStack) -> None:
    """`toolrail run "北京明天天气怎么样" --tools get_weather --json`: the demo's main job."""
    out = subprocess.run([sys.executable, "-m", "toolrail.cli", "run", "北京明天天气怎么样", "--tools", "get_weather", "--json",
                          "--max-steps", "1", "--url", stack.url],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "TOOLRAIL_LOG_LEVEL": "WARNING"})
    assert out.returncode == 0, out.stderr[-2000:]
    job = json.loads(out.stdout)
    assert job["status"] == "succeeded"
    (call,) = job["calls"]
    assert call["name"] == "get_weather"
    assert call["arguments"] == {"city": "Beijing", "date": "tomorrow", "unit": "celsius"}
    assert call["id"] == f"call_{job['request_id']}_0"
    assert call["result"]["city"] == "Beijing"


def test_agent_run_reads_the_result_and_answers(stack: LocalStack) -> None:
    """A run on the real model: it calls the tool, gets the result back as a tool message, and answers in text."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        created = client.post("/v1/jobs", json={
            "messages": [{"role": "user", "content": "What's the weather in Beijing tomorrow?"}], "tools": ["get_weather"]}).json()
        job = _wait(client, created["job_id"], timeout_s=600)
    assert job["status"] == "succeeded", json.dumps(job, ensure_ascii=False)[:3000]
    assert len(job["steps"]) >= 2, job["steps"]
    first = job["steps"][0]["calls"]
    assert [c["name"] for c in first] == ["get_weather"] and first[0]["status"] == "succeeded"
    assert job["content"] and not job["content"].lstrip().startswith("[")  # an answer in words
    # what the model was told came from the tool: the answer uses the tool's temperature
    assert str(first[0]["result"]["temperature"]) in job["content"], job["content"]


def test_invalid_client_output_goes_to_review_never_to_the_model(stack: LocalStack) -> None:
    """The client's 后天 is not a valid date: its output is the client's, so it waits for a person with the exact
    error — the real model configured here is never asked to write a call in its place (issue 32)."""
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        created = client.post("/v1/jobs", json={
            "messages": [{"role": "user", "content": "北京明天天气怎么样"}], "tools": ["get_weather"],
            "raw_output": '{"name": "get_weather", "arguments": {"city": "北京", "date": "后天"}}'}).json()
        job = _wait(client, created["job_id"])
    assert job["status"] == "needs_review", job
    assert [a["source"] for a in job["attempts"]] == ["client"] and job["calls"] == []
    assert "后天" in json.dumps(job["attempts"][0]["errors"], ensure_ascii=False)
    (sent,) = job["error"]["details"]["client_calls"]
    assert sent["name"] == "get_weather" and sent["errors"][0]["path"] == "/date"
