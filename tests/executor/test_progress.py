"""Tool progress: ``report_progress`` in a sandboxed tool → the worker → the job's SSE stream.

End to end through the real API and worker pool (the ``progress_reporter`` test tool), plus the
bounds of each stage on its own: the child's rate limit, the worker's reader, the recorder.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import httpx
import pytest
from tests.harness.jobs import wait_terminal

from executor.runs.progress_events import MAX_EVENTS_PER_CALL, progress_recorder
from executor.sandbox.progress import MAX_LINE_BYTES, ProgressReader
from executor.store.records import CallRecord, JobRecord
from tools.context import CallContext, encode_progress, flush_progress, report_progress, set_current_call


def submit(client: httpx.Client, arguments: dict) -> str:
    response = client.post("/v1/jobs", json={"tools": ["progress_reporter"],
                                             "tool_calls": [{"name": "progress_reporter", "arguments": arguments}]})
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def read_events(client: httpx.Client, job_id: str, *, last_event_id: str | None = None) -> list[dict]:
    """The job's SSE stream until it ends (the job's terminal status), as ``{id, event, data}``."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events, current = [], {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"timeout_s": 60}, headers=headers) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if not line:
                if "data" in current:
                    events.append(current)
                current = {}
            elif line.startswith("id: "):
                current["id"] = line[4:]
            elif line.startswith("event: "):
                current["event"] = line[7:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
    return events


def stream_order(event_id: str) -> tuple[int, int]:
    millis, _, seq = event_id.partition("-")
    return int(millis), int(seq)


def test_progress_reaches_the_stream_in_order_before_the_call_ends_and_resumes(client: httpx.Client) -> None:
    job_id = submit(client, {"steps": 3, "delay_s": 0.2})
    events = read_events(client, job_id)
    job = wait_terminal(client, job_id)
    assert job["status"] == "succeeded", job
    (call,) = job["calls"]
    progress = [e for e in events if e["event"] == "progress"]
    assert [(p["data"]["progress"], p["data"]["total"], p["data"]["message"]) for p in progress] == [
        (1, 3, "step 1 of 3"), (2, 3, "step 2 of 3"), (3, 3, "step 3 of 3")]
    assert all(p["data"]["call_id"] == call["id"] and p["data"]["index"] == 0 and p["data"]["name"] == "progress_reporter"
               and p["data"]["step"] == call["step"] for p in progress)
    ended = next(i for i, e in enumerate(events) if e["event"] == "call" and e["data"]["status"] == "succeeded")
    assert max(events.index(p) for p in progress) < ended  # every report before the call's terminal event
    ids = [stream_order(e["id"]) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # reconnect after the first report: the stream resumes right after it, nothing before it again
    first = events.index(progress[0])
    resumed = read_events(client, job_id, last_event_id=progress[0]["id"])
    assert [e["id"] for e in resumed] == [e["id"] for e in events[first + 1:]]
    assert [e["data"]["progress"] for e in resumed if e["event"] == "progress"] == [2, 3]


@pytest.mark.parametrize("raw", [False, True], ids=["report_progress", "raw-pipe"])
def test_a_flood_of_reports_is_bounded_and_the_call_succeeds(client: httpx.Client, raw: bool) -> None:
    job_id = submit(client, {"steps": 0, "flood": 10_000, "raw": raw})
    events = read_events(client, job_id)
    job = wait_terminal(client, job_id)
    assert job["status"] == "succeeded", job
    assert job["calls"][0]["result"] == {"steps": 0, "flood": 10_000}
    progress = [e["data"] for e in events if e["event"] == "progress"]
    assert 1 <= len(progress) <= 20, len(progress)  # 10,000 reports; ~10 per second of the call's life get through
    assert len(progress) <= MAX_EVENTS_PER_CALL
    if not raw:
        assert progress[-1]["progress"] == 10_000  # the last report is always delivered
    values = [p["progress"] for p in progress]
    assert values == sorted(values)


# ----------------------------------------------------------------- each stage alone


def test_report_progress_is_a_noop_outside_a_tool_run_and_checks_its_arguments() -> None:
    set_current_call(None)
    report_progress(1, 2, "nobody listens")  # no error, nothing written
    flush_progress()
    with pytest.raises(TypeError):
        report_progress("half")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        report_progress(float("nan"))
    with pytest.raises(ValueError):
        report_progress(1, -1)
    assert json.loads(encode_progress(1, None, "x" * 5000))["message"] == "x" * 500


def test_the_child_writes_at_most_ten_per_second_and_always_the_last() -> None:
    read_fd, write_fd = os.pipe()
    try:
        set_current_call(CallContext(request_id="r", job_id="j", call_id="c", idempotency_key="k", scratch_dir="/tmp",
                                     progress_fd=write_fd))
        started = time.monotonic()
        for i in range(1, 5001):
            report_progress(i, 5000)
        flush_progress()
        elapsed = time.monotonic() - started
        os.set_blocking(read_fd, False)
        lines = os.read(read_fd, 1 << 20).splitlines()
    finally:
        set_current_call(None)
        os.close(read_fd)
        os.close(write_fd)
    values = [json.loads(line)["progress"] for line in lines]
    assert values[0] == 1 and values[-1] == 5000
    assert len(values) <= 2 + int(elapsed * 10) + 1
    assert elapsed < 2.0  # cheap: 5,000 reports


def test_the_reader_drops_malformed_and_overlong_lines_and_survives_a_failing_callback() -> None:
    got: list[dict] = []
    reader = ProgressReader(got.append, call_id="c")
    reader.feed(b'{"progress": 1}\nnot json\n[1, 2]\n{"progress": "x"}\n{"progress": 1, "total": -1}\n')
    reader.feed(b"{" + b" " * (MAX_LINE_BYTES + 10))  # an over-long line, split over chunks
    reader.feed(b' "progress": 9}\n{"progress": 2, "message": ' + json.dumps("m" * 900).encode() + b"}\n")
    reader.finish()
    assert [g["progress"] for g in got] == [1, 2]  # 2 was held back (within 0.1 s) and delivered at the end
    assert len(got[1]["message"]) == 500

    def boom(_: dict) -> None:
        raise RuntimeError("store down")

    failing = ProgressReader(boom, call_id="c")
    failing.feed(b'{"progress": 1}\n')
    failing.finish()  # logged, not raised


def test_the_recorder_bounds_what_reaches_the_stream(runtime) -> None:
    job, _ = runtime.store.create(JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id="req-progress", tenant="default"))
    call = CallRecord(id="call_x_0", index=0, name="progress_reporter", step=2)
    record = progress_recorder(runtime, job.job_id, call)
    for i in range(1000):
        record({"progress": i, "total": 1000, "message": None})
    entries = runtime.redis.xrange(runtime.store.events_key(job.job_id))
    progress = [json.loads(fields[b"data"]) for _, fields in entries]
    progress = [p for p in progress if p["type"] == "progress"]
    assert 1 <= len(progress) <= 6  # a burst of 5 (plus a refill while looping), not 1000
    assert progress[0] == {"type": "progress", "call_id": "call_x_0", "index": 0, "name": "progress_reporter", "step": 2,
                           "progress": 0, "total": 1000, "message": None}


def test_the_recorder_gives_up_quietly_when_redis_is_down(runtime) -> None:
    import dataclasses

    import redis

    from toolrail.redis_embed import free_port

    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # no retries: redis-py 7's default (3, backing off up to 10 s) spent 5-10 s of this test on its first failure
    down = dataclasses.replace(runtime, redis=redis.Redis(port=free_port(), socket_connect_timeout=0.2, socket_timeout=0.2,
                                                          retry=Retry(NoBackoff(), 0)))
    record = progress_recorder(down, "job_gone", CallRecord(id="call_y_0", index=0, name="progress_reporter"))
    record({"progress": 1, "total": None, "message": None})  # logged, not raised
    started = time.monotonic()
    for i in range(100):
        record({"progress": i, "total": None, "message": None})
    assert time.monotonic() - started < 0.1  # no further attempt after the first failure
