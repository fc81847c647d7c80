"""End to end: a job whose decider picks an MCP-provided tool; the call runs on that server's queue, the
result comes back as a tool message and the run answers with it.

The default test drives the run loop with the scripted decider (tests/executor/scripted_decider.py, a
double of the model whose choice the test knows); ``test_real_model_picks_the_mcp_tool`` (marked
``model``) asks the real embedded model, offered only the MCP tool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import httpx
import pytest

from executor.job_client import wait_for_job
from executor.stack import start_worker, stop_process, wait_for_workers
from tests.harness.serving import api_server
from tests.harness.databases import own_database


@pytest.fixture(scope="module")
def scripted_api(db_url: str, tmp_path_factory) -> Iterator[str]:  # noqa: ANN001 - pytest's factory
    """A worker deciding with the scripted decider on queues decide + the test server's MCP queue, and its API."""
    from celery import Celery

    from executor.api.app import create_app
    from executor.runtime import Runtime
    from toolrail.settings import Settings

    env = {"TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": "tests.executor.scripted_decider:make",
           "TOOLRAIL_LOG_JSON": "1"}
    worker = start_worker(db_url, queues=["decide", "mcp.default.e2e"], concurrency=1, env=env,
                          log_file=tmp_path_factory.mktemp("mcp-e2e") / "worker.log", hostname="toolrail-mcp-e2e@%h")
    publisher = Celery("mcp-e2e", broker=db_url)
    settings = Settings(decider="custom", reconcile_interval_s=0)
    runtime = Runtime.from_settings(settings, redis_url=db_url)
    app = create_app(settings, runtime, mount_openai=False, ping_workers=lambda: 1,
                     enqueue=lambda job: publisher.send_task("toolrail.decide", args=[job.job_id], queue="decide"),
                     rerun=lambda job, call: publisher.send_task("toolrail.run_call", args=[job.job_id, call.id],
                                                                 queue=call.queue))
    try:
        with api_server(app) as base:
            wait_for_workers(db_url, count=1, timeout_s=90)
            yield base
    finally:
        stop_process(worker)


def test_scripted_decider_picks_the_mcp_tool(scripted_api: str, http_server: str) -> None:
    with httpx.Client(base_url=scripted_api, timeout=60) as client:
        client.post("/v1/mcp-servers", json={"name": "e2e", "url": http_server}).raise_for_status()
        script = {"steps": [{"calls": [{"name": "mcp__e2e__add", "arguments": {"a": 2, "b": 40}}]},
                            {"text": "the tool said {results}"}]}
        created = client.post("/v1/jobs", json={"messages": [{"role": "user", "content": "RUN " + json.dumps(script)}],
                                                "tools": ["mcp__e2e__add"], "max_steps": 2})
        assert created.status_code == 202, created.text
        job = wait_for_job(client, created.json()["job_id"], timeout_s=120)
    assert job["status"] == "succeeded", json.dumps(job)[:3000]
    (call,) = job["steps"][0]["calls"]
    assert call["name"] == "mcp__e2e__add" and call["arguments"] == {"a": 2, "b": 40}
    assert call["result"] == {"sum": 42} and call["status"] == "succeeded"
    assert '{\\"sum\\": 42}' in job["content"] or '"sum": 42' in job["content"], job["content"]


@pytest.mark.model
def test_real_model_picks_the_mcp_tool(http_server: str) -> None:
    """The embedded model, offered only the MCP tool, decides; the check path and the MCP client run its call.

    Decide and run are called in this process (``executor.runs.loop``, what the tasks call), on a Redis database
    of its own: the session's workers, which have no decider, must not take this job's decide task.
    """
    import uuid

    from executor.runs import loop as jobs
    from executor.runtime import Runtime
    from executor.store.records import JobRecord
    from mcpbridge import providers
    from toolrail.settings import Settings
    from tools.registry import default_registry

    url = own_database(f"{__name__}:model")
    settings = Settings(decider="embedded")
    rt = Runtime.from_settings(settings, redis_url=url)
    config = providers.ServerConfig.build("default", name="model", url=http_server)
    record = anyio.run(lambda: providers.fetch_and_check(dict(config), registry=default_registry(), settings=settings))
    providers.save_server(rt.redis, record)
    job = JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=uuid.uuid4().hex, tenant="default",
                    messages=[{"role": "user", "content": "What is 17 plus 25?"}], tools=["mcp__model__add"],
                    tool_choice="required", max_reasks=2)
    rt.store.create(job)
    queued = []
    jobs.decide_job(rt, job.job_id, lambda _job, call: queued.append(call), next_step=lambda _job: None)
    assert [c.queue for c in queued] == ["mcp.default.model"], rt.store.get(job.job_id).public()
    for call in queued:
        jobs.run_call(rt, job.job_id, call.id, next_step=lambda _job: None)
    done = rt.store.get(job.job_id).public()
    assert done["status"] == "succeeded", json.dumps(done)[:3000]
    (call,) = done["calls"]
    assert call["name"] == "mcp__model__add" and call["arguments"] == {"a": 17, "b": 25}
    assert call["result"] == {"sum": 42}
