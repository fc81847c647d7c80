"""A circuit breaker per tool, shared by every worker through Redis.

    closed ──N consecutive failures──▶ open ──cool-down──▶ half_open ──probe ok──▶ closed
                                         ▲                     │
                                         └────probe fails──────┘

While a tool's breaker is open its calls fail at once with ``circuit_open`` (a typed call
error, no sandbox started); after the cool-down one call goes through as a probe while the
others keep failing fast. Only failures that say something about the tool's health count:
timeouts, crashes, limits, untyped exceptions. A tool's own typed errors (insufficient
funds, bad input) are answers, not failures.

    tr:breaker:<tool>   hash: state, failures, opened_at, probe_until, opens
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from executor.errors import SandboxError, ToolRaisedError
from executor.sandbox import CallRun, SandboxResult
from toolrail.logging import get_logger
from tools.spec import ToolSpec

__all__ = ["STATES", "BreakerCollector", "CircuitBreaker", "CircuitOpenError", "breaker_for", "guarded_run",
           "is_health_failure"]

log = get_logger("toolrail.breaker")

#: Metric values of the states.
STATES = {"closed": 0, "half_open": 1, "open": 2}

_ALLOW = """
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if state == 'closed' then return {'closed', '0'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cooldown, probe_ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
if state == 'open' then
  local opened = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
  if now - opened < cooldown then return {'open', tostring(cooldown - (now - opened))} end
end
local probe_until = tonumber(redis.call('HGET', KEYS[1], 'probe_until') or '0')
if state == 'half_open' and now < probe_until then return {'open', tostring(probe_until - now)} end
redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_until', tostring(now + probe_ttl))
return {'probe', '0'}
"""

_RECORD = """
local ok, threshold = ARGV[1] == '1', tonumber(ARGV[2])
local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
if ok then
  redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0)
  return {state, 'closed'}
end
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
if state == 'half_open' or (state == 'closed' and failures >= threshold) then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', tostring(tonumber(t[1]) + tonumber(t[2]) / 1000000))
  redis.call('HINCRBY', KEYS[1], 'opens', 1)
  return {state, 'open'}
end
return {state, state}
"""


class CircuitOpenError(SandboxError):
    """The tool's breaker is open: the call fails fast without running."""

    type = "circuit_open"


def is_health_failure(exc: SandboxError) -> bool:
    """Whether a failed run counts against the tool's health."""
    if isinstance(exc, CircuitOpenError):
        return False
    if isinstance(exc, ToolRaisedError):
        return (exc.details.get("tool_error") or {}).get("type", "tool_error") == "tool_error"
    return True


@dataclass(frozen=True)
class Admission:
    state: str  # closed | probe | open
    retry_in_s: float = 0.0


class CircuitBreaker:
    """Breakers for every tool, state in Redis."""

    def __init__(self, client: redis.Redis, *, failures: int = 5, cooldown_s: float = 30.0, prefix: str = "tr:breaker") -> None:
        self._redis = client
        self.failures, self.cooldown_s = max(1, failures), cooldown_s
        self._prefix = prefix
        self._allow = client.register_script(_ALLOW)
        self._record = client.register_script(_RECORD)

    def key(self, tool: str) -> str:
        return f"{self._prefix}:{tool}"

    def admit(self, tool: str, *, probe_ttl_s: float) -> Admission:
        state, retry = self._allow(keys=[self.key(tool)], args=[self.cooldown_s, probe_ttl_s])
        return Admission(state.decode() if isinstance(state, bytes) else state, float(retry))

    def record(self, tool: str, *, ok: bool) -> tuple[str, str]:
        """Record one outcome; returns (state before, state after)."""
        before, after = self._record(keys=[self.key(tool)], args=["1" if ok else "0", self.failures])
        before, after = (v.decode() if isinstance(v, bytes) else v for v in (before, after))
        if before != after:
            log.warning("breaker.transition", tool=tool, before=before, after=after)
        return before, after

    def state(self, tool: str) -> dict[str, Any]:
        raw = {k.decode(): v.decode() for k, v in self._redis.hgetall(self.key(tool)).items()}
        return {"state": raw.get("state", "closed"), "failures": int(raw.get("failures", 0)), "opens": int(raw.get("opens", 0))}

    def reset(self, tool: str) -> None:
        self._redis.delete(self.key(tool))


def breaker_for(rt: Any) -> CircuitBreaker:
    """The runtime's breaker, built once per runtime."""
    breaker = rt.__dict__.get("_toolrail_breaker")
    if breaker is None:
        settings = rt.settings
        breaker = CircuitBreaker(rt.redis, failures=getattr(settings, "breaker_failures", 5),
                                 cooldown_s=getattr(settings, "breaker_cooldown_s", 30.0))
        rt.__dict__["_toolrail_breaker"] = breaker
    return breaker


def guarded_run(rt: Any, spec: ToolSpec, call: CallRun) -> SandboxResult:
    """``rt.sandbox.run`` behind the tool's circuit breaker."""
    breaker = breaker_for(rt)
    admission = breaker.admit(spec.name, probe_ttl_s=spec.timeout_s + 5)
    if admission.state == "open":
        raise CircuitOpenError(f"{spec.name} failed {breaker.failures} times in a row; its circuit is open, retry in "
                               f"{admission.retry_in_s:.1f} s", tool=spec.name, retry_in_s=round(admission.retry_in_s, 2))
    try:
        result = rt.sandbox.run(spec, call)
    except SandboxError as exc:
        breaker.record(spec.name, ok=not is_health_failure(exc))
        raise
    breaker.record(spec.name, ok=True)
    return result


class BreakerCollector:
    """Prometheus collector: every tool's breaker, read from Redis at scrape time."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Any]:
        state = GaugeMetricFamily("toolrail_breaker_state", "Circuit breaker per tool: 0 closed, 1 half-open, 2 open",
                                  labels=["tool"])
        failures = GaugeMetricFamily("toolrail_breaker_consecutive_failures", "Consecutive health failures per tool",
                                     labels=["tool"])
        opens = CounterMetricFamily("toolrail_breaker_opens", "Times the breaker opened per tool", labels=["tool"])
        try:
            breaker = breaker_for(self._runtime)
            tools = self._runtime.registry.names()
            pipe = self._runtime.redis.pipeline()
            for tool in tools:
                pipe.hgetall(breaker.key(tool))
            for tool, raw in zip(tools, pipe.execute(), strict=True):
                fields = {k.decode(): v.decode() for k, v in raw.items()}
                state.add_metric([tool], STATES.get(fields.get("state", "closed"), 0))
                failures.add_metric([tool], int(fields.get("failures", 0)))
                opens.add_metric([tool], int(fields.get("opens", 0)))
        except redis.RedisError:
            pass
        yield state
        yield failures
        yield opens
