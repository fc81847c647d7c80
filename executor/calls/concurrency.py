"""Adaptive concurrency per tool queue: a gradient limiter shared by every worker through Redis.

The limit on calls in flight for one queue follows latency, in the manner of Netflix's
``Gradient2Limiter``: a short-window average of call latency is compared with a long
baseline; while the short average stays within ``tolerance`` of the baseline the limit
grows by about its square root per sample, and when latency rises the limit is multiplied
by ``tolerance × baseline / short`` (at least 0.5, plus one) — fewer calls in flight until
latency comes back. Updates are smoothed (``smoothing``) so one slow call moves little.
Every update is one atomic script, so all workers see one limit per queue.

Slots are leases (a sorted set scored by expiry): a worker killed mid-call cannot leak
its slot for longer than the lease.

    tr:conc:<queue>            hash: limit, short_rtt, long_rtt, samples, last_rtt
    tr:conc:<queue>:inflight   zset: slot token → lease expiry
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import GaugeMetricFamily

from executor.errors import RetryableError
from toolrail.logging import get_logger

__all__ = ["ConcurrencyCollector", "ConcurrencyLimitedError", "ConcurrencyLimiter", "Slot"]

log = get_logger("toolrail.concurrency")

_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local limit = tonumber(redis.call('HGET', KEYS[1], 'limit') or ARGV[3])
local inflight = redis.call('ZCARD', KEYS[2])
if inflight < math.floor(limit) then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  return {1, inflight + 1, tostring(limit)}
end
return {0, inflight, tostring(limit)}
"""

#: ARGV: token, rtt, initial, min, max, tolerance, smoothing, short window, long window
_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
local rtt = tonumber(ARGV[2])
if rtt < 0 then return tostring(redis.call('HGET', KEYS[1], 'limit') or ARGV[3]) end
local lo, hi, tolerance, smoothing = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local short_w, long_w = tonumber(ARGV[8]), tonumber(ARGV[9])
local s = redis.call('HMGET', KEYS[1], 'limit', 'short_rtt', 'long_rtt')
local limit = tonumber(s[1]) or tonumber(ARGV[3])
local short = tonumber(s[2]) or rtt
local long = tonumber(s[3]) or rtt
short = short + (rtt - short) / short_w
long = long + (rtt - long) / long_w
if long > 2 * short then long = long * 0.95 end  -- latency fell for good: let the baseline follow
local gradient = math.max(0.5, math.min(1.0, tolerance * long / short))
local allowance = 1
if gradient >= 1.0 then allowance = math.sqrt(limit) end  -- grow by about sqrt(limit) only while latency holds
local target = limit * gradient + allowance
local new = limit * (1 - smoothing) + target * smoothing
new = math.max(lo, math.min(hi, new))
redis.call('HSET', KEYS[1], 'limit', tostring(new), 'short_rtt', tostring(short), 'long_rtt', tostring(long),
           'last_rtt', tostring(rtt))
redis.call('HINCRBY', KEYS[1], 'samples', 1)
return tostring(new)
"""


class ConcurrencyLimitedError(RetryableError):
    """No slot freed up in time; the call goes back to the queue (Celery retry)."""

    type = "concurrency_limited"


@dataclass(frozen=True)
class Slot:
    queue: str
    token: str
    started: float


class ConcurrencyLimiter:
    """Gradient limiters keyed by queue name."""

    def __init__(self, client: redis.Redis, *, initial: int = 16, minimum: int = 4, maximum: int = 256,
                 tolerance: float = 1.5, smoothing: float = 0.2, short_window: int = 5, long_window: int = 100,
                 prefix: str = "tr:conc") -> None:
        self._redis = client
        self.initial, self.minimum, self.maximum = initial, max(1, minimum), max(minimum, maximum)
        self.tolerance, self.smoothing = tolerance, smoothing
        self.short_window, self.long_window = short_window, long_window
        self._prefix = prefix
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    def keys(self, queue: str) -> list[str]:
        return [f"{self._prefix}:{queue}", f"{self._prefix}:{queue}:inflight"]

    def try_acquire(self, queue: str, *, lease_s: float) -> Slot | None:
        token = uuid.uuid4().hex
        ok, _inflight, _limit = self._acquire(keys=self.keys(queue), args=[token, lease_s, self.initial])
        return Slot(queue, token, time.monotonic()) if int(ok) else None

    def acquire(self, queue: str, *, lease_s: float, wait_s: float) -> Slot:
        """A slot for one call, waiting up to ``wait_s``; ``ConcurrencyLimitedError`` when none frees up."""
        deadline = time.monotonic() + wait_s
        pause = 0.02
        while True:
            got = self.try_acquire(queue, lease_s=lease_s)
            if got is not None:
                return got
            if time.monotonic() >= deadline:
                state = self.state(queue)
                raise ConcurrencyLimitedError(f"queue {queue} is at its concurrency limit ({state['limit']:.1f})",
                                              queue=queue, limit=state["limit"], in_flight=state["in_flight"],
                                              retry_in_s=round(random.uniform(0.5, 2.0), 2))
            time.sleep(pause)
            pause = min(0.25, pause * 1.5)

    def release(self, slot: Slot, *, rtt_s: float | None = None) -> float:
        """Free the slot; with a latency sample, update the queue's limit. Returns the limit."""
        rtt = -1.0 if rtt_s is None else max(1e-6, rtt_s)
        new = self._release(keys=self.keys(slot.queue), args=[slot.token, rtt, self.initial, self.minimum, self.maximum,
                                                               self.tolerance, self.smoothing, self.short_window,
                                                               self.long_window])
        return float(new)

    def record(self, queue: str, rtt_s: float) -> float:
        """Feed one latency sample without a slot (tests, warm-up)."""
        return self.release(Slot(queue, "-", time.monotonic()), rtt_s=rtt_s)

    def state(self, queue: str) -> dict[str, float]:
        pipe = self._redis.pipeline()
        pipe.hgetall(self.keys(queue)[0])
        pipe.zcount(self.keys(queue)[1], time.time(), "+inf")
        raw, inflight = pipe.execute()
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        return {"limit": float(fields.get("limit", self.initial)), "in_flight": int(inflight),
                "short_rtt_s": float(fields.get("short_rtt", 0)), "long_rtt_s": float(fields.get("long_rtt", 0)),
                "samples": int(fields.get("samples", 0))}

    def reset(self, queue: str) -> None:
        self._redis.delete(*self.keys(queue))


class ConcurrencyCollector:
    """Prometheus collector: limit and calls in flight per tool queue, read at scrape time."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Any]:
        limit = GaugeMetricFamily("toolrail_concurrency_limit", "Adaptive limit of calls in flight per tool queue",
                                  labels=["queue"])
        inflight = GaugeMetricFamily("toolrail_concurrency_in_flight", "Calls in flight per tool queue", labels=["queue"])
        latency = GaugeMetricFamily("toolrail_concurrency_latency_seconds", "Short-window call latency per tool queue",
                                    labels=["queue"])
        try:
            limiter = self._runtime.concurrency
            for queue in self._runtime.registry.queues():
                state = limiter.state(queue)
                limit.add_metric([queue], state["limit"])
                inflight.add_metric([queue], state["in_flight"])
                latency.add_metric([queue], state["short_rtt_s"])
        except redis.RedisError:
            pass
        yield limit
        yield inflight
        yield latency
