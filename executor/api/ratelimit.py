"""Per-tenant rate limits on the API: a token bucket per tenant in Redis, one atomic script.

Every API replica shares the bucket, so the limit holds for the fleet, not per process.
A request over the limit is answered at once with 429, ``Retry-After`` and the standard
error body: shedding costs one Redis round trip, so the API keeps its latency for the
requests it accepts instead of queueing everything until it times out.

``install_load_control`` wires this module, the circuit breakers (``executor.calls.breaker``)
and the concurrency limiters (``executor.calls.concurrency``) into the app's ``/metrics``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from fastapi import Depends, FastAPI, Request
from prometheus_client import CollectorRegistry, Counter
from executor.calls.breaker import BreakerCollector
from executor.calls.concurrency import ConcurrencyCollector
from toolrail.errors import ToolrailError

__all__ = ["Decision", "RateLimitedError", "RateLimiter", "install_load_control", "rate_limited"]

#: KEYS[1] bucket; ARGV rate/s, burst, cost. Time comes from the Redis server: one clock for every replica.
_BUCKET = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local allowed, retry = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, tostring(tokens), tostring(retry)}
"""


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: float
    retry_after_s: float


class RateLimitedError(ToolrailError):
    """The tenant is over its rate limit (HTTP 429)."""

    type = "rate_limited"
    status = 429
    retryable = True

    def __init__(self, tenant: str, decision: Decision, *, rate_per_s: float, burst: int) -> None:
        super().__init__(f"rate limit of {rate_per_s:g} requests/s (burst {burst}) exceeded; retry in "
                         f"{decision.retry_after_s:.2f} s")
        self.tenant, self.decision, self.retry_after_s = tenant, decision, decision.retry_after_s
        self.details = {"limit_per_s": rate_per_s, "burst": burst, "retry_after_s": round(decision.retry_after_s, 3)}


class RateLimiter:
    """Token buckets keyed by tenant; ``rate_per_s <= 0`` lets everything through. ``rejected``: the 429s counted by
    tenant, when given."""

    def __init__(self, client: redis.Redis, *, rate_per_s: float, burst: int, prefix: str = "tr:rl",
                 rejected: Counter | None = None) -> None:
        self.rate_per_s, self.burst = float(rate_per_s), max(1, int(burst))
        self._prefix, self._rejected = prefix, rejected
        self._script = client.register_script(_BUCKET)

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def acquire(self, tenant: str, *, cost: int = 1) -> Decision:
        """Take ``cost`` tokens from the tenant's bucket if it has them."""
        if not self.enabled:
            return Decision(True, math.inf, 0.0)
        allowed, remaining, retry = self._script(keys=[f"{self._prefix}:{tenant}"], args=[self.rate_per_s, self.burst, cost])
        return Decision(bool(int(allowed)), float(remaining), float(retry))

    def check(self, tenant: str) -> None:
        """Raise ``RateLimitedError`` when the tenant is over its limit."""
        decision = self.acquire(tenant)
        if not decision.allowed:
            if self._rejected is not None:
                self._rejected.labels(tenant).inc()
            raise RateLimitedError(tenant, decision, rate_per_s=self.rate_per_s, burst=self.burst)


def rate_limited(tenant_dependency: Callable[..., str]) -> Callable[..., str]:
    """A FastAPI dependency: the caller's tenant (from ``tenant_dependency``), charged one token."""

    def dependency(request: Request, tenant: str = Depends(tenant_dependency)) -> str:
        limiter: RateLimiter | None = getattr(request.app.state, "rate_limiter", None)
        if limiter is not None:
            limiter.check(tenant)
        return tenant

    return dependency


def install_load_control(app: FastAPI, *, settings: Any, runtime: Any, metrics: CollectorRegistry,
                         counters: CollectorRegistry | None) -> RateLimiter:
    """Rate limiter on ``app.state`` and the load-control metrics (the 429 counter in ``counters``: ``None`` when
    several API processes share their counters through prometheus_client's files). Its 429 is the API's one mapping
    of ``ToolrailError`` (``Retry-After`` from ``retry_after_s``)."""
    rejected = Counter("toolrail_rate_limited_total", "Requests answered 429 by the per-tenant rate limit", ["tenant"],
                       registry=counters)
    limiter = RateLimiter(runtime.redis, rate_per_s=settings.rate_limit_per_s, burst=settings.rate_limit_burst,
                          rejected=rejected)
    app.state.rate_limiter = limiter
    metrics.register(BreakerCollector(runtime))
    metrics.register(ConcurrencyCollector(runtime))
    return limiter
