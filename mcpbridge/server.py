"""toolrail as an MCP server: ``tools/list`` from the registry, ``tools/call`` through the job path.

    MCP client ──POST /mcp (streamable HTTP, stateless)──▶ McpEndpoint (API key → tenant, or loopback
        only without keys; the tenant's rate limit) ──▶ SDK session manager ──▶ handlers below
    tools/call ──▶ a job with ``tool_calls`` (the store and enqueue of ``POST /v1/jobs``) ──▶ decide task:
        validate → clean → contracts ──▶ the tool's queue: sandbox (or its MCP server), breakers apply
        ◀── the job's event stream: ``progress`` events → ``notifications/progress``; terminal status
    ◀── CallToolResult: ``structuredContent`` (the result; a plain-text result as text content only), or
        ``isError: true`` with the typed error (validation errors included: the model reads them and tries
        again); ``_meta`` carries the job id and the request id. An unknown tool is the JSON-RPC error
        -32602 (invalid params), as the spec has it; ``GET /mcp`` is 405 (stateless: no server stream).

A client's cancellation cancels the job (``set_status(..., "cancelled")``: calls not started never
run): the client closing the call's response stream, or its ``notifications/cancelled`` — which, the
endpoint being stateless, arrives on a POST of its own, possibly at another replica, and is matched
to the job through ``tr:mcp:rpc:<tenant>:<request id>`` (the tenant's own calls only; an id two of
its calls in flight share cancels neither).

Stateless: no MCP session lives in one API process, so any replica answers any request. The wait for
a job is bounded (``TOOLRAIL_MCP_CALL_TIMEOUT_S``); past it the result is ``isError`` with the job id,
and the job goes on (``GET /v1/jobs/{id}``). ``toolrail mcp stdio`` serves the same handlers on
stdin/stdout for local hosts (tenant ``default``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp_types import INVALID_PARAMS
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from executor.ports import JobRecord, Jobs
from mcpbridge.providers import specs_for
from mcpbridge.session import META_PREFIX
from mcpbridge.settings import McpSettings, mcp_settings
from toolrail import tracing
from toolrail.context import new_request_id, sanitize_request_id
from toolrail.logging import get_logger
from toolrail.trace_sinks import TraceClaims
from tools.errors import UnknownToolError

__all__ = ["McpEndpoint", "McpService", "TENANT_SCOPE_KEY", "build_server", "serve_stdio"]

log = get_logger("toolrail.mcp.server")

#: Where the authenticated tenant and the request id travel in the ASGI scope (set by ``McpEndpoint``).
TENANT_SCOPE_KEY = "toolrail.tenant"
REQUEST_ID_SCOPE_KEY = "toolrail.request_id"


class McpService:
    """The MCP face of one API process: tool listing and calls for a tenant, over the job store and queue."""

    def __init__(self, jobs: Jobs, settings: Any, mcp: McpSettings | None = None) -> None:
        self.jobs, self.runtime, self.settings, self.mcp = jobs, jobs.runtime, settings, mcp or mcp_settings()
        #: Whose a client's trace id is (as ``POST /v1/jobs`` asks): a foreign one starts a new trace, linked to it.
        self._trace_claims = TraceClaims(self.runtime.redis, ttl_s=int(getattr(settings, "trace_store_ttl_s", 86400)))

    def specs(self, tenant: str) -> list[Any]:
        """The tools a tenant sees: the registry's, then its MCP servers' (``mcp__<server>__<tool>``)."""
        return [*self.runtime.registry.specs(), *specs_for(self.runtime.redis, tenant).values()]

    async def list_tools(self, tenant: str) -> types.ListToolsResult:
        specs = await asyncio.to_thread(self.specs, tenant)
        tools = []
        for spec in specs:
            output = getattr(spec, "output_schema", None)
            annotations = types.ToolAnnotations(destructive_hint=spec.side_effects,
                                                read_only_hint=False if spec.side_effects else None)
            tools.append(types.Tool(name=spec.name, description=spec.description or None, input_schema=spec.parameters,
                                    output_schema=output, annotations=annotations))
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, tenant: str, request_id: str, name: str, arguments: Any,
                        report: Callable[[float, float | None, str | None], Any] | None = None,
                        rpc_id: Any = None) -> types.CallToolResult:
        """Run ``name`` as a one-call job and map its outcome to a ``CallToolResult``.

        ``rpc_id``: the JSON-RPC id of the client's request, which its ``notifications/cancelled`` names.
        """
        known = {spec.name for spec in await asyncio.to_thread(self.specs, tenant)}
        if name not in known:  # a protocol error, not a tool's (MCP spec, server/tools "Error Handling")
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}", data={"type": "unknown_tool", "tool": name})
        # the tenant as baggage and the trace id's owner checked, as POST /v1/jobs does (a thread: the claim is Redis)
        trace_context = await asyncio.to_thread(tracing.new_job_context, request_id, tenant=tenant,
                                                claim=self._trace_claims)
        job = JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=request_id, tenant=tenant, tools=[name],
                        max_reasks=0, client_output={"tool_calls": [{"name": name, "arguments": arguments
                                                                     if arguments is not None else {}}]},
                        trace_context=trace_context)
        store = self.runtime.store
        try:
            await asyncio.to_thread(self._submit, job)
        except Exception as exc:  # noqa: BLE001 - the broker is down: say so, as POST /v1/jobs does
            return _error_result({"type": "enqueue_failed", "message": f"could not queue the call: {type(exc).__name__}",
                                  "details": {}}, job_id=job.job_id, request_id=request_id)
        log.info("mcp.call", job_id=job.job_id, tool=name, tenant=tenant)
        rpc_key = self._rpc_key(tenant, rpc_id)
        if rpc_key is not None:
            await self.jobs.async_redis().sadd(rpc_key, job.job_id)
            await self.jobs.async_redis().expire(rpc_key, int(self.mcp.call_timeout_s) + 60)
        try:
            status = await self._wait(job.job_id, report=report)
        except anyio.get_cancelled_exc_class():  # the client went away or gave up: so does its job
            with anyio.CancelScope(shield=True):
                await asyncio.to_thread(self.cancel_job, job.job_id, "the MCP client cancelled the call")
            raise
        finally:
            if rpc_key is not None:
                with anyio.CancelScope(shield=True):
                    await self.jobs.async_redis().srem(rpc_key, job.job_id)
        record = await asyncio.to_thread(store.get, job.job_id)
        if status is None:
            return _error_result({"type": "timeout", "message": f"the call did not finish within "
                                  f"{self.mcp.call_timeout_s:g} s; it goes on as job {job.job_id}",
                                  "details": {"status": record.status}}, job_id=job.job_id, request_id=request_id)
        return _result_of(record, request_id=request_id)

    @staticmethod
    def _rpc_key(tenant: str, rpc_id: Any) -> str | None:
        return None if rpc_id is None else f"tr:mcp:rpc:{tenant}:{str(rpc_id)[:200]}"

    def cancel_job(self, job_id: str, why: str) -> None:
        """Cancel a job the MCP client gave up on (nothing if it has ended)."""
        job, _ = self.jobs.cancel(job_id, why)
        log.info("mcp.call_cancelled", job_id=job_id, status=job.status)

    async def cancelled(self, tenant: str, rpc_id: Any) -> str | None:
        """A ``notifications/cancelled`` for ``rpc_id``: cancel the one job of ``tenant`` it names; its id, or None."""
        rpc_key = self._rpc_key(tenant, rpc_id)
        members = await self.jobs.async_redis().smembers(rpc_key) if rpc_key else set()
        if len(members) != 1:
            return None  # unknown, finished, or ambiguous (two of the tenant's calls share the id): cancel nothing
        job_id = next(iter(members))
        job_id = job_id.decode() if isinstance(job_id, bytes) else job_id
        await asyncio.to_thread(self.cancel_job, job_id, "the MCP client cancelled the call (notifications/cancelled)")
        return job_id

    def _submit(self, job: JobRecord) -> None:
        """``POST /v1/jobs``'s one path (``Jobs.submit``): its deadline, the client's calls checked and queued straight
        to their tool queues, a queueing failure ending the job failed."""
        self.jobs.submit(job)

    async def _wait(self, job_id: str, *, report: Callable[..., Any] | None) -> str | None:
        """Wait on the job's event stream until it settles (ends, or waits for approval), as ``GET /v1/jobs/{id}?wait``
        does; its progress events are reported."""

        async def progress(event: dict[str, Any]) -> None:
            nonlocal report
            if event.get("type") == "progress" and report is not None:
                try:
                    await report(float(event.get("progress") or 0), event.get("total"), event.get("message"))
                except Exception:  # noqa: BLE001 - a client gone away does not stop the job
                    report = None

        return await self.jobs.settled(job_id, wait_s=float(self.mcp.call_timeout_s), on_event=progress)


def _meta(job_id: str | None, request_id: str) -> dict[str, Any]:
    meta = {f"{META_PREFIX}request_id": request_id}
    if job_id:
        meta[f"{META_PREFIX}job_id"] = job_id
    return meta


def _error_result(error: dict[str, Any], *, request_id: str, job_id: str | None = None) -> types.CallToolResult:
    text = f"{error.get('type')}: {error.get('message')}"
    details = error.get("details") or {}
    if details:
        text += "\n" + json.dumps(details, ensure_ascii=False, default=str)[:4000]
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True,
                                _meta={**_meta(job_id, request_id), f"{META_PREFIX}error": error})


def _result_of(job: JobRecord, *, request_id: str) -> types.CallToolResult:
    """A finished (or paused) job → the MCP result of its one call."""
    call = job.calls[-1] if job.calls else None
    if job.status == "succeeded" and call is not None and call.status == "succeeded" and isinstance(call.result, str):
        return types.CallToolResult(content=[types.TextContent(text=call.result)], _meta=_meta(job.job_id, request_id))
    if job.status == "succeeded" and call is not None and call.status == "succeeded":
        value = call.result if isinstance(call.result, dict) else {"result": call.result}
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(value, ensure_ascii=False, default=str))],
                                    structured_content=value, _meta=_meta(job.job_id, request_id))
    if job.status == "succeeded" and call is not None and call.status == "validated":  # a tool without a body
        value = {"validated": True, "arguments": call.arguments}
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(value, ensure_ascii=False))],
                                    structured_content=value, _meta=_meta(job.job_id, request_id))
    if job.status == "awaiting_approval":
        return _error_result({"type": "awaiting_approval", "message": "the call waits for a person's approval; "
                              f"follow job {job.job_id}", "details": {}}, job_id=job.job_id, request_id=request_id)
    if call is not None and call.error:
        return _error_result(call.error.model_dump(), job_id=job.job_id, request_id=request_id)
    error = job.error.model_dump() if job.error else {"type": job.status, "message": f"the job ended {job.status}",
                                                      "details": {}}
    return _error_result(error, job_id=job.job_id, request_id=request_id)


def build_server(service: McpService, *, tenant_of: Callable[[Any], str] | None = None,
                 request_id_of: Callable[[Any], str] | None = None) -> Server:
    """The low-level SDK server over ``service``; ``tenant_of(ctx)`` names the caller's tenant."""

    def tenant(ctx: Any) -> str:
        if tenant_of is not None:
            return tenant_of(ctx)
        scope = getattr(getattr(ctx, "request", None), "scope", None) or {}
        return scope.get(TENANT_SCOPE_KEY, "default")

    def request_id(ctx: Any) -> str:
        if request_id_of is not None:
            return request_id_of(ctx)
        scope = getattr(getattr(ctx, "request", None), "scope", None) or {}
        return scope.get(REQUEST_ID_SCOPE_KEY) or sanitize_request_id(None)

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return await service.list_tools(tenant(ctx))

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async def report(progress: float, total: float | None, message: str | None) -> None:
            await ctx.session.report_progress(progress, total, message)

        try:
            return await service.call_tool(tenant(ctx), request_id(ctx), params.name, params.arguments, report=report,
                                           rpc_id=getattr(ctx, "request_id", None))
        except UnknownToolError as exc:  # a server-provided tool gone between listing and call
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}",
                           data={"type": "unknown_tool", "tool": params.name, "message": str(exc)}) from None

    async def on_cancelled(ctx: Any, params: types.CancelledNotificationParams) -> None:
        if params.request_id is not None:
            # shielded: the stateless request that brought the notice ends (202) while the cancel is written
            with anyio.CancelScope(shield=True):
                await service.cancelled(tenant(ctx), params.request_id)

    server = Server("toolrail", version="0.1.0", instructions="Tools run by toolrail: every call is validated, "
                    "cleaned and executed once in a sandbox; errors come back as isError results to act on.",
                    on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    server.add_notification_handler("notifications/cancelled", types.CancelledNotificationParams, on_cancelled)
    return server


def serve_stdio(jobs: Jobs, settings: Any) -> None:
    """MCP on this process's stdin/stdout for a local host (tenant ``default``), until the host closes it."""
    server = build_server(McpService(jobs, settings), tenant_of=lambda ctx: "default",
                          request_id_of=lambda ctx: new_request_id())

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)


class McpEndpoint:
    """The ASGI app at ``/mcp``: authentication, the tenant's rate limit, then the SDK's session manager."""

    def __init__(self, server: Server, *, tenants: dict[str, str], loopback_names: tuple[str, ...],
                 rate_limiter: Any = None, allowed_hosts: str = "", allowed_origins: str = "") -> None:
        self._server, self._tenants, self._limiter = server, tenants, rate_limiter
        self._hosts = [*loopback_names, *(h.strip().lower() for h in allowed_hosts.split(",") if h.strip())]
        self._origins = [o.strip().lower().rstrip("/") for o in allowed_origins.split(",") if o.strip()]
        self._asgi: StreamableHTTPASGIApp | None = None

    def security(self) -> TransportSecuritySettings:
        """The SDK's DNS-rebinding protection: without API keys, ``Host`` and ``Origin`` must name loopback.

        A key-less install answers loopback clients only, and a web page whose name rebinds to 127.0.0.1 is
        such a client: the browser sends the page's name as ``Host`` and its origin as ``Origin``, both
        refused here (421, 403) — behind the API's own check of every route (``executor.api.middleware``),
        with the same operator additions (``TOOLRAIL_ALLOWED_HOSTS`` / ``_ORIGINS``). With keys a request
        needs one, which no foreign page has.
        """
        if self._tenants:
            return TransportSecuritySettings(enable_dns_rebinding_protection=False)
        hosts = [f"{name}{port}" for name in self._hosts for port in ("", ":*")]
        origins = [f"{scheme}://{host}" for scheme in ("http", "https") for host in hosts] + self._origins
        return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=origins)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager for one run of the app's lifespan (a manager runs once: a new one each time)."""
        manager = StreamableHTTPSessionManager(app=self._server, stateless=True, json_response=False,
                                               security_settings=self.security())
        async with manager.run():
            self._asgi = StreamableHTTPASGIApp(manager)
            try:
                yield
            finally:
                self._asgi = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self._tenants:
            auth = headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
            tenant = self._tenants.get(key)
            if tenant is None:
                await _reply(send, 401, "unauthorized", "a valid API key is required (Authorization: Bearer <key>)",
                             extra=[(b"www-authenticate", b"Bearer")])
                return
        else:
            host = (scope.get("client") or ("", 0))[0]
            if host not in {"127.0.0.1", "::1", "localhost"} and not str(host).startswith("127."):
                await _reply(send, 403, "forbidden", "without API keys, /mcp answers loopback clients only")
                return
            tenant = "default"
        if self._limiter is not None:
            decision = await asyncio.to_thread(self._limiter.acquire, tenant)
            if not decision.allowed:
                await _reply(send, 429, "rate_limited", f"rate limit exceeded; retry in {decision.retry_after_s:.2f} s",
                             extra=[(b"retry-after", str(max(1, int(decision.retry_after_s + 0.999))).encode())])
                return
        if scope.get("method") == "GET":  # stateless: no server-initiated stream (the spec's 405, not an idle stream)
            await _reply(send, 405, "method_not_allowed", "/mcp takes POST (stateless streamable HTTP: no GET stream)",
                         extra=[(b"allow", b"POST")])
            return
        if self._asgi is None:  # the app's lifespan has not started it (or has ended)
            await _reply(send, 503, "unavailable", "the MCP endpoint is not running")
            return
        state = scope.get("state") or {}
        scope[TENANT_SCOPE_KEY] = tenant
        scope[REQUEST_ID_SCOPE_KEY] = state.get("request_id") or sanitize_request_id(headers.get("x-request-id"))
        await self._asgi(scope, receive, send)


async def _reply(send: Callable, status: int, type_: str, message: str, *, extra: list | None = None) -> None:
    body = json.dumps({"error": {"type": type_, "message": message, "details": {}}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
