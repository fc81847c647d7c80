"""One trace per job across every hop (issue 15), with real processes.

The API runs in this process (the SDK's in-memory exporter plus the Redis span sink); a real
Celery worker pool of its own (``TOOLRAIL_TRACE_STORE=redis``) decides through the real Triton
client against the Triton wire-protocol double of ``tests/decider/triton_double.py`` (Triton
cannot run here: the double, named as such, scripts the model's text), and runs tools in real
sandbox children, which record their spans in memory and return them in their result frame.
Everything lives in a Redis database of its own, so the session's shared worker never takes
these tasks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.harness.processes import parent_pid

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decider"))
from triton_double import TritonProtocolDouble, serve_double  # noqa: E402 - the Triton wire double

from toolrail import tracing  # noqa: E402
from toolrail.trace_sinks import span_to_dict  # noqa: E402
from executor.worker.config import worker_queues
from tests.harness.databases import own_database
from tests.harness.receiver import Receiver

CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result")
PROMPT = "北京和上海明天的天气怎么样？"


# ----------------------------------------------------------------- the Triton double and its tokenizer


def _tokenizer_dir(root: Path) -> Path:
    """A tiny byte-level BPE tokenizer with a ChatML template, saved as a model directory (config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_end|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['[{"name": "get_weather", "arguments": {"city": "北京", "date": "tomorrow"}}]'] * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fast.save_pretrained(root)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 4096}))
    return root


def _script(fields: dict[str, Any]) -> str:
    """The double's model: a date outside the tool's enum first; after the re-ask, two valid calls; once the
    tool results are in, a text answer (the run's second step)."""
    if "<|im_start|>tool\n" in fields["text_input"]:
        return '{"content": "北京和上海明天都是晴天。"}'
    if "is not one of" in fields["text_input"]:
        return ('[{"name": "get_weather", "arguments": {"city": "北京", "date": "tomorrow"}}, '
                '{"name": "get_weather", "arguments": {"city": "上海", "date": "tomorrow"}}]')
    return '[{"name": "get_weather", "arguments": {"city": "北京", "date": "2026-12-01"}}]'


async def _produce(fields: dict[str, Any]) -> AsyncIterator[str]:
    text = _script(fields)
    for start in range(0, len(text), 16):
        await asyncio.sleep(0.001)
        yield text[start:start + 16]


class RecordingDouble(TritonProtocolDouble):
    """The double, also keeping each request's W3C parameters (what the client sent per request)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace_parameters: list[dict[str, str]] = []

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - gRPC method name
        async def tap():
            async for request in request_iterator:
                self.trace_parameters.append({key: value.string_param for key, value in request.parameters.items()
                                              if key in ("traceparent", "tracestate", "baggage")})
                yield request

        async for response in super().ModelStreamInfer(tap(), context):
            yield response


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[tuple[str, str, Path, RecordingDouble]]:
    from engine_build.triton_repo import RepoOptions, write_triton_repo
    from transformers import AutoTokenizer

    tok_dir = _tokenizer_dir(tmp_path_factory.mktemp("tracing-tokenizer"))
    root = tmp_path_factory.mktemp("tracing-triton-repo")
    repo = write_triton_repo(RepoOptions(flavor="pytorch", output=root, model="/models/m", engine_dir="/engines/m"),
                             AutoTokenizer.from_pretrained(str(tok_dir)))
    double = RecordingDouble(root, _produce, seed=3)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server, url = asyncio.run_coroutine_threadsafe(serve_double(double), loop).result(10)
    yield url, repo.entry_model, tok_dir, double
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


# ----------------------------------------------------------------- a traced stack of its own


@pytest.fixture(scope="module")
def trace_url(redis_url: str) -> str:
    return own_database(__name__)


@pytest.fixture(scope="module")
def traced_worker(trace_url: str, worker_env: dict[str, str], triton, tmp_path_factory) -> Iterator[Any]:
    """A real worker pool (one process: a SIGKILL hits the call's process) with tracing to Redis and the Triton decider."""
    from tests.harness.serving import worker_pool
    from tools.registry import default_registry

    url, entry, tok_dir, _ = triton
    env = {**worker_env, "TOOLRAIL_TRACE_STORE": "redis", "TOOLRAIL_DECIDER": "triton", "TOOLRAIL_TRITON_URL": url,
           "TOOLRAIL_TRITON_MODEL": entry, "TOOLRAIL_MODEL": str(tok_dir), "TOOLRAIL_DECIDER_CANDIDATES": "0"}
    env.pop("TOOLRAIL_TRACE_CONTENT", None)
    log_file = tmp_path_factory.mktemp("tracing-worker") / "worker.log"
    try:
        with worker_pool(trace_url, queues=worker_queues(default_registry()), concurrency=1, env=env,
                         log_file=log_file, hostname="toolrail-tracing@%h") as proc:
            yield proc
    finally:
        print(log_file.read_text()[-3000:] if log_file.exists() else "")


@pytest.fixture(scope="module")
def traced_api(trace_url: str, traced_worker) -> Iterator[tuple[str, Any]]:
    """The real API in this process, tracing to the in-memory exporter and the Redis sink, publishing to the traced broker."""
    from celery import Celery

    from executor.api.app import create_app
    from executor.worker.config import celery_config
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail.context import CELERY_REQUEST_ID_HEADER
    from toolrail.settings import get_settings

    saved = os.environ.get("TOOLRAIL_TRACE_STORE")
    os.environ["TOOLRAIL_TRACE_STORE"] = "redis"
    get_settings.cache_clear()
    settings = get_settings()
    runtime = Runtime.from_settings(settings, redis_url=trace_url)
    tracing.setup("api", memory=True, redis_client=runtime.redis)
    publisher = Celery("toolrail-tracing-test")
    publisher.conf.update(celery_config(trace_url))

    def enqueue(job: Any) -> None:
        publisher.send_task("toolrail.decide", args=[job.job_id], queue="decide",
                            headers={CELERY_REQUEST_ID_HEADER: job.request_id})

    try:
        with api_server(create_app(settings, runtime, enqueue=enqueue, ping_workers=lambda: 1,
                                   mount_openai=False)) as base:
            yield base, runtime
    finally:
        if saved is None:
            os.environ.pop("TOOLRAIL_TRACE_STORE", None)
        else:
            os.environ["TOOLRAIL_TRACE_STORE"] = saved
        get_settings.cache_clear()


@pytest.fixture()
def tclient(traced_api) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=traced_api[0], timeout=30) as c:
        yield c


def _run(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    from executor.job_client import wait_for_job

    response = client.post("/v1/jobs", json=body, headers=headers or {})
    assert response.status_code == 202, response.text
    job = wait_for_job(client, response.json()["job_id"], timeout_s=90, poll_s=0.1)
    return job


def _spans(client: httpx.Client, job_id: str, *, until: Any, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """The job's spans from ``GET /v1/jobs/{id}/trace`` once ``until(spans)`` holds (spans arrive in batches)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/jobs/{job_id}/trace").json()
        spans = body["spans"]
        if until(spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.2)


def _whole(spans: list[dict[str, Any]]) -> bool:
    """Every span's parent has arrived (only the root may name a parent from outside: an incoming traceparent)."""
    ids = {s["span_id"] for s in spans}
    return sum(1 for s in spans if s.get("parent_span_id") and s["parent_span_id"] not in ids) <= 1


def _named(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"].startswith(prefix)]


def _ancestors(span: dict[str, Any], spans: list[dict[str, Any]]) -> list[str]:
    by_id = {s["span_id"]: s for s in spans}
    names, parent = [], span.get("parent_span_id")
    while parent in by_id:
        names.append(by_id[parent]["name"])
        parent = by_id[parent].get("parent_span_id")
    return names


# ----------------------------------------------------------------- tests


def test_one_job_with_a_reasked_decision_and_two_calls_is_one_trace(tclient: httpx.Client, triton) -> None:
    double = triton[3]
    job = _run(tclient, {"messages": [{"role": "user", "content": PROMPT}], "tools": ["get_weather"], "max_reasks": 2})
    assert job["status"] == "succeeded", json.dumps(job)[:2000]
    calls = sorted(job["calls"], key=lambda c: c["index"])
    assert [c["arguments"]["city"] for c in calls] == ["Beijing", "Shanghai"]  # the tool's aliases normalized them
    spans = _spans(tclient, job["job_id"], until=lambda s: len(_named(s, "sandbox ")) >= 2 and _named(s, "job")
                   and len(_named(s, "step ")) >= 2 and _whole(s))

    assert len({s["trace_id"] for s in spans}) == 1, sorted({s["trace_id"] for s in spans})
    (job_span,) = _named(spans, "job")
    assert job_span["attributes"]["toolrail.request_id"] == job["request_id"]
    assert job_span["attributes"]["toolrail.job.status"] == "succeeded"
    (post,) = [s for s in spans if s["name"] == "POST /v1/jobs"]
    assert job_span["parent_span_id"] == post["span_id"] and post["parent_span_id"] is None
    assert post["attributes"]["toolrail.request_id"] == job["request_id"]
    assert job_span["start_ns"] <= min(s["start_ns"] for s in spans if s is not post) + 1_000_000

    assert job["content"] and len(_named(spans, "step ")) == 2  # calls, then the answer from their results
    chats = sorted([c for c in _named(spans, "chat ") if _ancestors(c, spans)[:1] == ["step 0"]],
                   key=lambda s: s["attributes"]["toolrail.decision.attempt"])
    assert [c["attributes"]["toolrail.decision.attempt"] for c in chats] == [0, 1]  # the re-ask is its own attempt
    assert chats[0]["attributes"]["toolrail.decision.check_errors"] >= 1
    assert chats[1]["attributes"]["toolrail.decision.check_errors"] == 0
    for chat in chats:
        assert chat["kind"] == "CLIENT" and chat["attributes"]["gen_ai.operation.name"] == "chat"
        assert chat["attributes"]["gen_ai.usage.input_tokens"] > 0
        assert chat["attributes"]["toolrail.decision.time_to_first_token_s"] > 0
        assert _ancestors(chat, spans)[:1] == ["step 0"] and "job" in _ancestors(chat, spans)
    # each Triton request carried its own attempt's span as its parent (request parameters, one shared stream)
    sent = [p["traceparent"].split("-")[2] for p in double.trace_parameters if p.get("traceparent")]
    assert {c["span_id"] for c in chats} <= set(sent)

    tools = _named(spans, "execute_tool ")
    assert sorted(t["attributes"]["gen_ai.tool.call.id"] for t in tools) == sorted(c["id"] for c in calls)
    worker_pid = tools[0]["resource"]["process.pid"]
    for tool in tools:
        assert tool["name"] == "execute_tool get_weather" and tool["attributes"]["toolrail.call.status"] == "succeeded"
        assert "step 0" in _ancestors(tool, spans) and "job" in _ancestors(tool, spans)
        (child,) = [s for s in _named(spans, "sandbox ") if s["parent_span_id"] == tool["span_id"]]
        assert child["resource"]["service.name"] == "toolrail-sandbox"
        assert child["resource"]["process.pid"] != worker_pid  # recorded in the sandbox child, exported by the worker
    assert {s["resource"]["service.name"] for s in spans} >= {"toolrail-api", "toolrail-worker", "toolrail-sandbox"}
    assert _named(spans, "queue wait decide") and _named(spans, "queue wait tool.get_weather")
    # content is opt-in: nothing of the conversation, the arguments or the results by default
    assert not [k for s in spans for k in s["attributes"] if k in CONTENT_KEYS]
    # what `toolrail run --trace` prints: the tree, each span under its parent, with its process
    from executor.trace_view import render_tree

    tree = render_tree(tclient.get(f"/v1/jobs/{job['job_id']}/trace").json()).splitlines()
    assert tree[1].startswith("POST /v1/jobs") and tree[2].startswith("└─ job  [succeeded]")
    assert any("execute_tool get_weather  [succeeded]" in line and "toolrail-worker[" in line for line in tree)
    assert any("sandbox get_weather" in line and "toolrail-sandbox[" in line for line in tree)
    # the API process's own exporter holds its spans of the same trace
    memory = tracing.memory_exporter()
    assert memory is not None
    assert any(f"{s.context.trace_id:032x}" == job_span["trace_id"] and s.name == "POST /v1/jobs"
               for s in memory.get_finished_spans())


def test_an_incoming_traceparent_is_honoured_and_polls_link_to_the_job(tclient: httpx.Client) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    job = _run(tclient, {"tools": ["get_weather"], "tool_calls": [{"name": "get_weather",
                                                                   "arguments": {"city": "Beijing", "date": "today"}}]},
               headers={"traceparent": f"00-{trace_id}-{parent}-01", "X-Request-ID": "trace-incoming-1"})
    assert job["status"] == "succeeded"
    spans = _spans(tclient, job["job_id"], until=lambda s: _named(s, "sandbox ") and _named(s, "job") and _whole(s))
    assert {s["trace_id"] for s in spans} == {trace_id}
    (post,) = [s for s in spans if s["name"] == "POST /v1/jobs"]
    assert post["parent_span_id"] == parent
    (job_span,) = _named(spans, "job")
    assert job_span["attributes"]["toolrail.request_id"] == "trace-incoming-1"
    # a later poll is a trace of its own, linked to the job span
    memory = tracing.memory_exporter()
    polls = [s for s in memory.get_finished_spans() if s.name.startswith("GET /v1/jobs/")
             and any(f"{link.context.span_id:016x}" == job_span["span_id"] for link in s.links)]
    assert polls and all(f"{p.context.trace_id:032x}" != trace_id for p in polls)


def test_a_job_resumed_after_a_worker_sigkill_stays_in_its_trace(tclient: httpx.Client, traced_worker,
                                                                  traced_api) -> None:
    runtime = traced_api[1]
    response = tclient.post("/v1/jobs", json={"tools": ["slow_echo"], "tool_calls": [
        {"name": "slow_echo", "arguments": {"value": "survives", "delay_s": 3.0}}]})
    job_id = response.json()["job_id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        calls = runtime.store.get(job_id).calls
        if calls and calls[0].status == "running":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the call never started")
    time.sleep(0.5)
    pool = [int(p) for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) == traced_worker.pid]
    assert len(pool) == 1, pool
    os.kill(pool[0], signal.SIGKILL)  # the pool process running the call dies mid-call; the task is redelivered
    from executor.job_client import wait_for_job

    job = wait_for_job(tclient, job_id, timeout_s=90)
    assert job["status"] == "succeeded", json.dumps(job)[:2000]
    assert job["calls"][0]["attempts"] == 2
    spans = _spans(tclient, job_id, until=lambda s: _named(s, "execute_tool ") and _named(s, "job") and _whole(s))
    assert len({s["trace_id"] for s in spans}) == 1
    (tool,) = _named(spans, "execute_tool ")  # the killed run never ended its span; the rerun did
    assert "job" in _ancestors(tool, spans)
    runs = _named(spans, "run/toolrail.run_call")
    assert runs and {r["parent_span_id"] for r in runs} <= {s["span_id"] for s in _named(spans, "apply_async/")}


def test_a_cancelled_job_has_its_job_span(tclient: httpx.Client) -> None:
    from executor.job_client import wait_for_job

    response = tclient.post("/v1/jobs", json={"tools": ["slow_echo"], "tool_calls": [
        {"name": "slow_echo", "arguments": {"value": "never mind", "delay_s": 2.0}}]})
    job_id = response.json()["job_id"]
    assert tclient.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert wait_for_job(tclient, job_id, timeout_s=30)["status"] == "cancelled"
    spans = _spans(tclient, job_id, until=lambda s: _named(s, "job"))
    (job_span,) = _named(spans, "job")
    assert job_span["attributes"]["toolrail.job.status"] == "cancelled" and job_span["status"] == "ERROR"
    assert job_span["parent_span_id"] == next(s["span_id"] for s in spans if s["name"] == "POST /v1/jobs")


def test_content_attributes_only_when_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracing.setup("api", memory=True)
    exporter = tracing.memory_exporter()
    assert isinstance(exporter, InMemorySpanExporter)
    for opted_in in (False, True):
        monkeypatch.setenv(tracing.CONTENT_ENV, "1" if opted_in else "0")
        exporter.clear()
        with tracing.execute_tool_span("transfer", "call_x_0", arguments={"to": "bob", "amount": 5}) as span:
            tracing.record_tool(span, status="succeeded", result={"status": "applied"})
        chat = tracing.start_chat("m", attempt=0, messages=[{"role": "user", "content": "pay bob 5"}])
        tracing.record_decision(chat, usage={"prompt_tokens": 3}, output='[{"name": "transfer"}]')
        tracing.finish_chat(chat)
        keys = {k for s in exporter.get_finished_spans() for k in (s.attributes or {})}
        assert bool(keys & set(CONTENT_KEYS)) is opted_in, keys
        if opted_in:
            assert keys >= set(CONTENT_KEYS)
            assert all((s.attributes or {}).get(tracing.SENSITIVE) for s in exporter.get_finished_spans())
        else:
            assert tracing.SENSITIVE not in keys


def test_a_sandbox_child_cannot_put_spans_into_another_trace() -> None:
    tracing.setup("api", memory=True)
    exporter = tracing.memory_exporter()
    with tracing.execute_tool_span("t", "c") as span:
        carrier = tracing.current_context()
        own = format(span.get_span_context().trace_id, "032x")
    exporter.clear()
    good = {"name": "sandbox t", "trace_id": own, "span_id": "1" * 16, "parent_span_id": "2" * 16, "kind": "INTERNAL",
            "start_ns": 1, "end_ns": 2, "status": "UNSET", "attributes": {"a": 1}, "resource": {"service.name": "x"}}
    foreign = {**good, "trace_id": "f" * 32, "span_id": "3" * 16}
    assert tracing.adopt_spans([good, foreign, {"junk": True}, "x"], trace_context=carrier) == 1
    (kept,) = exporter.get_finished_spans()
    assert span_to_dict(kept)["trace_id"] == own and kept.name == "sandbox t"


_EMIT = """
import sys
from toolrail import tracing
provider = tracing.setup("worker")
with tracing.tracer().start_as_current_span("otlp probe"):
    pass
provider.force_flush(10_000)
print("recording" if tracing.recording() else "silent")
"""


def test_otlp_export_only_when_the_endpoint_is_set(tmp_path: Path) -> None:
    """A real HTTP receiver gets OTLP/HTTP protobuf from a process with OTEL_EXPORTER_OTLP_ENDPOINT, nothing without."""
    import subprocess

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    receiver = Receiver(content_type="application/x-protobuf")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "TOOLRAIL_TRACE_STORE"}
    try:
        for endpoint in (None, receiver.url("")):
            env = {**base_env, **({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if endpoint else {})}
            out = subprocess.run([sys.executable, "-c", _EMIT], env=env, capture_output=True, text=True, timeout=60,
                                 cwd=Path(__file__).resolve().parents[2])
            assert out.returncode == 0, out.stderr[-2000:]
            assert out.stdout.strip() == ("recording" if endpoint else "silent")
            if endpoint is None:
                assert receiver.seen() == []  # off by default: nothing leaves the process
    finally:
        receiver.close()
    ((path, body),) = [(r["path"], r["body"]) for r in receiver.seen()]
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    names = [span.name for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    services = {a.value.string_value for rs in request.resource_spans for a in rs.resource.attributes
                if a.key == "service.name"}
    assert names == ["otlp probe"] and services == {"toolrail-worker"}


_RELAY_PROBE = """
import json
from types import SimpleNamespace

from celery.signals import after_task_publish, before_task_publish, task_postrun, task_prerun
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor

from executor.worker.tracing import instrument_celery
from toolrail import tracing

instrument_celery("worker")
parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
class Task:  # what the signals get: a task whose request carries the message's headers
    name = "toolrail.run_call"
    request = SimpleNamespace(traceparent=parent, headers={}, id="t1", hostname="w", delivery_info={}, args=[], kwargs={})


task = Task()
task_prerun.send(sender=task, task=task, task_id="t1", args=[], kwargs={})
headers = {"id": "t2", "task": "toolrail.decide"}
published = {"sender": "toolrail.decide", "headers": headers, "body": ((), {}, {}), "routing_key": "decide", "exchange": ""}
before_task_publish.send(**published, declare=[], properties={})
after_task_publish.send(**published)
task_postrun.send(sender=task, task=task, task_id="t1", args=[], kwargs={}, retval=None, state="SUCCESS")
print(json.dumps({"recording": tracing.recording(), "spans": CeleryInstrumentor().is_instrumented_by_opentelemetry,
                  "published": headers.get("traceparent"),
                  "after": trace.get_current_span().get_span_context().is_valid}))
"""


def _probe_without_and_with_a_sink(code: str) -> dict[str, dict]:
    """Run ``code`` in a fresh interpreter with ``TOOLRAIL_TRACE_STORE`` none, then memory; its last line, parsed."""
    import subprocess

    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "TOOLRAIL_TRACE_STORE"}
    seen = {}
    for store in ("none", "memory"):
        out = subprocess.run([sys.executable, "-c", code], env={**base_env, "TOOLRAIL_TRACE_STORE": store},
                             capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
        assert out.returncode == 0, out.stderr[-2000:]
        seen[store] = json.loads(out.stdout.strip().splitlines()[-1])
    return seen


def test_a_worker_without_a_sink_relays_the_context_and_makes_no_spans() -> None:
    """No sink: the task's context is current while it runs and goes into what it publishes (the job's trace goes
    on in workers that record), without the Celery instrumentation's spans; with a sink, the instrumentation."""
    seen = _probe_without_and_with_a_sink(_RELAY_PROBE)
    assert seen["none"]["recording"] is False and seen["none"]["spans"] is False
    assert seen["memory"]["recording"] is True and seen["memory"]["spans"] is True
    for store, probe in seen.items():
        assert probe["published"].split("-")[1] == "a" * 32, store  # the task's trace goes on in what it publishes
    assert seen["none"]["published"] == "00-" + "a" * 32 + "-" + "b" * 16 + "-01"  # no span of its own in between
    assert seen["none"]["after"] is False  # the context ends with the task


_API_PROBE = """
import json

from fastapi import FastAPI
from fastapi.testclient import TestClient

from prometheus_client import CollectorRegistry, Histogram

from executor.api.middleware import LocalOnly, RequestGate
from executor.api.tracing import instrument_api
from toolrail import tracing

app = FastAPI()


@app.get("/probe")
def probe() -> dict:
    return {"job": tracing.new_job_context("req-1"), "current": tracing.current_context()}


spans = instrument_api(app, runtime=None)  # and the API's gate, as create_app adds it: the context without spans
app.add_middleware(RequestGate, latency=Histogram("latency", "", ["method", "route", "status"], registry=CollectorRegistry()),
                   local=LocalOnly(keyed=True), max_bytes=1000, max_depth=8, trace_context=not spans)
parent = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
with TestClient(app) as client:
    joined = client.get("/probe", headers={"traceparent": parent}).json()
    fresh = client.get("/probe").json()
print(json.dumps({"recording": tracing.recording(), "instrumented": bool(getattr(app, "_is_instrumented_by_opentelemetry",
                  False)), "joined": joined, "fresh": fresh}))
"""


def test_an_api_without_a_sink_makes_no_spans_and_the_job_joins_the_clients_trace() -> None:
    """No sink: no FastAPI instrumentation, yet a client's ``traceparent`` is current for the request (the API's
    ``RequestGate``), so the job's context continues the client's trace (and what the request publishes carries it); with a sink, the instrumentation."""
    seen = _probe_without_and_with_a_sink(_API_PROBE)
    assert seen["none"]["recording"] is False and seen["none"]["instrumented"] is False
    assert seen["memory"]["recording"] is True and seen["memory"]["instrumented"] is True
    for store, probe in seen.items():
        assert probe["joined"]["job"]["traceparent"].split("-")[1] == "c" * 32, store
        assert probe["fresh"]["job"]["traceparent"].split("-")[1] != "c" * 32, store  # no context leaks between requests
    assert seen["none"]["joined"]["current"]["traceparent"] == "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
