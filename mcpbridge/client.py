"""A worker's calls of MCP-provided tools: :func:`run_call`, the sandbox's contract for a tool of an MCP server.

The run loop's MCP tool source (:mod:`mcpbridge.source`) sends a call of an MCP spec here. It runs on the worker
process's open session to the server (:mod:`mcpbridge.pool`; one MCP exchange is
:mod:`mcpbridge.session`'s), under:

- the operator's ceiling on timeouts (``TOOLRAIL_MCP_MAX_TIMEOUT_S``: a stored ``timeout_s`` above it is clamped);
- a per-tenant limit on MCP calls in flight across all workers (``TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT``,
  leases in Redis: ``tr:mcp:tenant:<tenant>:inflight``). The worker pool is shared, so without it one
  tenant's hanging server would hold every worker process; a call that finds no slot goes back
  to its queue at once and holds nothing (``McpTenantLimitError``, retried by the task a few times, then the
  call's own typed error).

When the server says its tool list changed, the tenant's record is refreshed before the result is
returned. The result is a ``SandboxResult``; every error is typed and names the server and the tool.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from executor.errors import SandboxError
from executor.ports import CallRun, ConcurrencyLimitedError, ConcurrencyLimiter, Runtime, SandboxResult
from mcpbridge import providers
from mcpbridge.errors import McpTenantLimitError
from mcpbridge.pool import pool
from mcpbridge.session import META_PREFIX, Endpoint, Trouble, call_error, checked_result, invoke
from mcpbridge.settings import allows_private_urls, mcp_settings
from toolrail.logging import get_logger

__all__ = ["run_call", "tenant_slot", "tenant_slots"]

log = get_logger("toolrail.mcp.client")

#: How long a call waits for one of its tenant's slots before going back to the queue: not at all, since a worker
#: waiting here is a worker the other tenants do not have (bench/mcp.py --call-fairness: 1 s cost them 11x).
SLOT_WAIT_S = 0.0


def tenant_slots(rt: Runtime) -> ConcurrencyLimiter:
    """The per-tenant limiter of MCP calls in flight (a fixed limit: ``TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT``)."""
    limit = int(mcp_settings().max_concurrent_per_tenant)
    return ConcurrencyLimiter(rt.redis, initial=limit, minimum=limit, maximum=limit, prefix="tr:mcp:tenant")


def _timeouts(rt: Runtime, spec: Any) -> tuple[float, float, float]:
    """(timeout, idle timeout, connect timeout) of a call of ``spec``, under the operator's ceiling."""
    mcp = mcp_settings()
    timeout_s, idle_timeout_s = providers.timeouts({"timeout_s": spec.timeout_s, "idle_timeout_s": spec.idle_timeout_s},
                                                   mcp)
    return timeout_s, idle_timeout_s, min(timeout_s, float(mcp.connect_timeout_s))


@contextmanager
def tenant_slot(rt: Runtime, spec: Any) -> Iterator[None]:
    """Hold one of the tenant's MCP call slots for the body; none free is ``ConcurrencyLimitedError`` at once (the
    call goes back to its queue). The run loop takes it before the call's idempotency lock (``McpToolSource.admit``),
    so a call sent back holds nothing another delivery would wait for."""
    timeout_s, _, connect_timeout_s = _timeouts(rt, spec)
    slots = tenant_slots(rt)
    try:
        slot = slots.acquire(spec.tenant, lease_s=timeout_s + connect_timeout_s + 60, wait_s=SLOT_WAIT_S)
    except ConcurrencyLimitedError as exc:
        raise McpTenantLimitError(f"tenant {spec.tenant!r} has {slots.maximum} MCP calls in flight, its limit "
                                  "(TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT)", tool=spec.name, server=spec.server,
                                  tenant=spec.tenant, limit=slots.maximum, retry_in_s=exc.details.get("retry_in_s")) from None
    try:
        yield
    finally:
        try:
            slots.release(slot)
        except redis.RedisError:  # the lease expires on its own; the call's outcome stands
            log.warning("mcp.slot_release_failed", tenant=spec.tenant, server=spec.server)


def run_call(rt: Runtime, spec: Any, call: CallRun) -> SandboxResult:
    """Run one call of an MCP-provided tool from a worker (inside its tenant's slot: :func:`tenant_slot`): the
    sandbox's contract (result type, typed errors)."""
    timeout_s, idle_timeout_s, connect_timeout_s = _timeouts(rt, spec)
    return _run(rt, spec, call, timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, connect_timeout_s=connect_timeout_s)


def _run(rt: Runtime, spec: Any, call: CallRun, *, timeout_s: float, idle_timeout_s: float,
         connect_timeout_s: float) -> SandboxResult:
    meta = {f"{META_PREFIX}request_id": call.request_id, f"{META_PREFIX}job_id": call.job_id,
            f"{META_PREFIX}call_id": call.call_id}
    if spec.side_effects:
        meta[f"{META_PREFIX}idempotency_key"] = call.idempotency_key
    # a stdio server lives as long as its pooled session (mcpbridge.pool.MAX_AGE_S): CPU seconds for that long
    endpoint = Endpoint.of(spec.server, spec.endpoint, memory_mb=spec.memory_mb, cpu_s=max(int(timeout_s) + 30, 900),
                           allow_private=allows_private_urls(rt.settings, mcp_settings()))
    started = time.monotonic()
    report = getattr(call, "on_progress", None)
    names = {"server": spec.server, "tool": spec.remote_name, "tool_name": spec.name}

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if report is not None:  # the job's progress events (executor.sandbox.progress); never fails the call
            try:
                report({"progress": value, "total": total, "message": (message or "")[:200] or None})
            except Exception:  # noqa: BLE001
                pass

    async def one_call(client: Any, trouble: Trouble) -> tuple[dict[str, Any] | str, bool]:
        result = await invoke(client, trouble, endpoint, spec.remote_name, call.arguments, names=names,
                              timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, meta=meta,
                              on_progress=on_progress, started=time.monotonic())
        return checked_result(result, names=names, output_schema=spec.output_schema), trouble.list_changed

    key = (spec.tenant, spec.server, json.dumps(spec.endpoint, sort_keys=True), spec.memory_mb)
    try:
        value, changed = pool.run(key, endpoint, one_call, deadline_s=timeout_s, connect_timeout_s=connect_timeout_s)
    except SandboxError as exc:
        exc.details.update(names)
        raise
    except Exception as caught:  # noqa: BLE001 - whatever else ended the call, typed
        raise call_error(caught, Trouble(), endpoint, spec.remote_name, names) from None
    if changed:
        try:
            pool.wait(providers.refresh_server(rt, spec.tenant, spec.server),
                      timeout_s=float(mcp_settings().connect_timeout_s) * 2 + 10)
        except Exception as exc:  # noqa: BLE001 - the call succeeded; a failed refresh is retried later
            log.warning("mcp.refresh_failed", server=spec.server, error=str(exc))
    return SandboxResult(result=value, duration_s=round(time.monotonic() - started, 6), pid=os.getpid(),
                         network="mcp", logs=[], isolation={"mcp": "url" if endpoint.url else "stdio-launch"})
