"""A circuit breaker per (tenant, tool), shared by every worker through Redis.

    closed ──N consecutive failures──▶ open ──cool-down──▶ half_open ──probe ok──▶ closed
                                         ▲                     │
                                         └────probe fails──────┘

While a tool's breaker is open its calls fail at once with ``circuit_open`` (a typed call
error, no sandbox started); after the cool-down one call goes through as a probe while the
others keep failing fast. Only failures that say something about the tool's health count:
timeouts, crashes, limits, untyped exceptions. A tool's own typed errors (insufficient
funds, bad input) are answers, not failures.

Every one of those failures can be caused by a tenant's input (arguments that make the tool
crash, loop or eat memory), so the breaker is keyed by tenant as well as tool: one tenant's
crashing calls open its own breaker and nobody else's. A tool broken for everyone costs each
tenant ``failures`` calls before its breaker opens. The metrics name no tenant: per tool, the
worst state, how many tenants have it open, and the opens summed.

    tr:breaker:<tool>@<tenant>   hash: state, failures, opened_at, probe_until, opens (expires a day
                                 after its last change)
    tr:breaker:<tool>:tenants    set: tenants with a breaker hash for the tool (for the metrics)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from executor.errors import SandboxError, ToolRaisedError
from toolrail.logging import get_logger

__all__ = ["DEFAULT_TENANT", "STATES", "BreakerCollector", "CircuitBreaker", "CircuitOpenError",
           "is_health_failure"]

log = get_logger("toolrail.breaker")

#: Metric values of the states.
STATES = {"closed": 0, "half_open": 1, "open": 2}
#: The tenant of a deployment without API keys (``executor.api.app.tenant_of``'s answer then).
DEFAULT_TENANT = "default"
#: Seconds a (tenant, tool) breaker is kept after its last change.
BREAKER_TTL_S = 24 * 3600

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
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0)
    redis.call('EXPIRE', KEYS[1], ARGV[3])
  end
  return {state, 'closed'}
end
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[3])
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
        # a typed error is the tool's answer (its own type, or an MCP tool's under details.tool_error): not ill health
        return exc.type == "tool_error" and (exc.details.get("tool_error") or {}).get("type", "tool_error") == "tool_error"
    return True


@dataclass(frozen=True)
class Admission:
    state: str  # closed | probe | open
    retry_in_s: float = 0.0


class CircuitBreaker:
    """Breakers for every (tenant, tool) pair, state in Redis."""

    def __init__(self, client: redis.Redis, *, failures: int = 5, cooldown_s: float = 30.0, prefix: str = "tr:breaker") -> None:
        self._redis = client
        self.failures, self.cooldown_s = max(1, failures), cooldown_s
        self._prefix = prefix
        self._allow = client.register_script(_ALLOW)
        self._record = client.register_script(_RECORD)

    def key(self, tool: str, tenant: str = DEFAULT_TENANT) -> str:
        return f"{self._prefix}:{tool}@{tenant}"

    def tenants_key(self, tool: str) -> str:
        return f"{self._prefix}:{tool}:tenants"

    def admit(self, tool: str, *, tenant: str = DEFAULT_TENANT, probe_ttl_s: float) -> Admission:
        state, retry = self._allow(keys=[self.key(tool, tenant)], args=[self.cooldown_s, probe_ttl_s])
        return Admission(state.decode() if isinstance(state, bytes) else state, float(retry))

    def record(self, tool: str, *, tenant: str = DEFAULT_TENANT, ok: bool) -> tuple[str, str]:
        """Record one outcome of the tenant's call; returns (state before, state after)."""
        before, after = self._record(keys=[self.key(tool, tenant), self.tenants_key(tool)],
                                     args=["1" if ok else "0", self.failures, BREAKER_TTL_S, tenant])
        before, after = (v.decode() if isinstance(v, bytes) else v for v in (before, after))
        if before != after:
            log.warning("breaker.transition", tool=tool, tenant=tenant, before=before, after=after)
        return before, after

    def state(self, tool: str, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        raw = {k.decode(): v.decode() for k, v in self._redis.hgetall(self.key(tool, tenant)).items()}
        return {"state": raw.get("state", "closed"), "failures": int(raw.get("failures", 0)), "opens": int(raw.get("opens", 0))}

    def reset(self, tool: str, tenant: str | None = None) -> None:
        """Forget the tenant's breaker for ``tool``; every tenant's when ``tenant`` is None."""
        if tenant is not None:
            self._redis.delete(self.key(tool, tenant))
            return
        tenants = [t.decode() for t in self._redis.smembers(self.tenants_key(tool))]
        self._redis.delete(self.tenants_key(tool), *(self.key(tool, t) for t in {*tenants, DEFAULT_TENANT}))


class BreakerCollector:
    """Prometheus collector: every tool's breakers, read from Redis at scrape time; no tenant named."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Any]:
        state = GaugeMetricFamily("toolrail_breaker_state", "Worst circuit breaker state of a tool over tenants: 0 "
                                  "closed, 1 half-open, 2 open", labels=["tool"])
        open_for = GaugeMetricFamily("toolrail_breaker_open_tenants", "Tenants whose breaker of the tool is open",
                                     labels=["tool"])
        failures = GaugeMetricFamily("toolrail_breaker_consecutive_failures", "Most consecutive health failures of a "
                                     "tool for one tenant", labels=["tool"])
        opens = CounterMetricFamily("toolrail_breaker_opens", "Times a breaker of the tool opened, all tenants",
                                    labels=["tool"])
        try:
            breaker = self._runtime.breaker
            tools = self._runtime.registry.names()
            pipe = self._runtime.redis.pipeline()
            for tool in tools:
                pipe.smembers(breaker.tenants_key(tool))
            tenants = [sorted({t.decode() for t in members} | {DEFAULT_TENANT}) for members in pipe.execute()]
            for tool, names in zip(tools, tenants, strict=True):
                for tenant in names:
                    pipe.hgetall(breaker.key(tool, tenant))
            rows = iter(pipe.execute())
            for tool, names in zip(tools, tenants, strict=True):
                hashes = [{k.decode(): v.decode() for k, v in next(rows).items()} for _ in names]
                states = [STATES.get(h.get("state", "closed"), 0) for h in hashes]
                state.add_metric([tool], max(states))
                open_for.add_metric([tool], sum(1 for s in states if s == STATES["open"]))
                failures.add_metric([tool], max(int(h.get("failures", 0)) for h in hashes))
                opens.add_metric([tool], sum(int(h.get("opens", 0)) for h in hashes))
        except redis.RedisError:
            pass
        yield state
        yield open_for
        yield failures
        yield opens
