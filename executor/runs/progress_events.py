"""A call's progress reports as ``progress`` events on its job's stream, bounded again before Redis.

The sandbox's ``ProgressReader`` already parses at most ``PROGRESS_MAX_PER_S`` reports a second; here a
token bucket and ``MAX_EVENTS_PER_CALL`` bound what one call may write, and a Redis failure stops the
recording (the call's own outcome matters more than its progress).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from executor.store.records import CallRecord
from toolrail.logging import get_logger
from tools.context import PROGRESS_MAX_PER_S

if TYPE_CHECKING:
    from executor.ports import Runtime

__all__ = ["MAX_EVENTS_PER_CALL", "progress_recorder"]

log = get_logger("toolrail.progress")

#: Progress events one call may add to its job's event stream.
MAX_EVENTS_PER_CALL = 200
#: The recorder's token bucket: this many events at once, refilled at ``PROGRESS_MAX_PER_S``.
_BURST = 5
#: What the store trims each job's event stream to (approximately), as ``RedisJobStore`` does.
_STREAM_MAXLEN = 1000


def progress_recorder(rt: Runtime, job_id: str, call: CallRecord) -> Callable[[dict[str, Any]], None]:
    """``on_progress`` for one call: each report becomes a ``progress`` event on the job's stream (throttled, bounded)."""
    key = rt.store.events_key(job_id)
    ids = {"call_id": call.id, "index": call.index, "name": call.name, "step": call.step}
    state = {"tokens": float(_BURST), "at": time.monotonic(), "written": 0, "dropped": 0, "failed": False}

    def record(report: dict[str, Any]) -> None:
        if state["failed"]:  # Redis failed once: the call's own outcome matters more than its progress
            return
        now = time.monotonic()
        state["tokens"] = min(float(_BURST), state["tokens"] + (now - state["at"]) * PROGRESS_MAX_PER_S)
        state["at"] = now
        if state["written"] >= MAX_EVENTS_PER_CALL or state["tokens"] < 1:
            state["dropped"] += 1
            if state["dropped"] == 1:
                log.info("tool.progress_throttled", job_id=job_id, max_events=MAX_EVENTS_PER_CALL, **ids)
            return
        state["tokens"] -= 1
        event = {"type": "progress", **ids, "progress": report.get("progress"), "total": report.get("total"),
                 "message": report.get("message")}
        try:
            rt.redis.xadd(key, {"data": json.dumps(event, ensure_ascii=False, default=str)}, maxlen=_STREAM_MAXLEN)
            state["written"] += 1
        except redis.RedisError as exc:
            state["failed"] = True
            log.warning("tool.progress_not_recorded", job_id=job_id, error=f"{type(exc).__name__}: {exc}", **ids)

    return record
