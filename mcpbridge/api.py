"""The API's MCP routes: ``/mcp`` (toolrail as an MCP server) and ``/v1/mcp-servers`` (providers).

    POST   /v1/mcp-servers                 register {name, url | command, ...}: fetched, checked, stored → 201
    GET    /v1/mcp-servers                 the tenant's servers with their tools and refusals
    GET    /v1/mcp-servers/{name}          one server
    POST   /v1/mcp-servers/{name}/refresh  fetch its tools again
    DELETE /v1/mcp-servers/{name}          forget it (its tools leave ``GET /v1/tools``)
    POST   /mcp                            MCP streamable HTTP, stateless

``mount(app, api)`` adds both and returns a :class:`McpBridge`, whose ``running()`` the app's lifespan
enters (the SDK's session manager, and the periodic refresh of every server's tools).

Who may register what (docs/mcp.md): a stdio server runs a command on the workers, so it is accepted
only when ``TOOLRAIL_MCP_ALLOW_STDIO`` says so (default: only without API keys, a one-user install);
a URL whose host resolves to a non-public address (:mod:`toolrail.netguard`, checked at every
connection: 403 ``mcp_url_not_allowed``) only when ``TOOLRAIL_MCP_ALLOW_PRIVATE_URLS`` says so (same default); timeouts
up to ``TOOLRAIL_MCP_MAX_TIMEOUT_S``. A registration or refresh waits for the server on the event
loop, holding no thread, and a tenant has at most ``TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT`` of them
in flight per API process (429 past it).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.routing import Route

from executor.errors import SandboxError
from executor.ports import ApiContext
from mcpbridge import providers
from mcpbridge.errors import McpServerRejectedError, McpTooLargeError, McpUrlNotAllowedError
from mcpbridge.server import McpEndpoint, McpService, build_server
from mcpbridge.settings import McpSettings, allows_stdio, mcp_settings
from mcpbridge.spec import SERVER_NAME
from toolrail.logging import get_logger

__all__ = ["McpBridge", "McpServerCreate", "mount"]

log = get_logger("toolrail.mcp.api")

#: A variable a registration may declare for its stdio server.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

class McpServerCreate(BaseModel):
    """A server to register: ``url`` (streamable HTTP) or ``command`` (stdio argv), limits and operator flags."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=20, description="1-20 of a-z 0-9 _ - (no '__', not ending in '_'); tools become "
                                                 "mcp__<name>__<tool>")
    url: str | None = Field(default=None, max_length=2000, pattern=r"^https?://")
    command: list[str] | None = Field(default=None, min_length=1, max_length=64)
    network: bool = Field(default=False, description="stdio only: the server may connect over TCP to ports 53, 80 and "
                                                     "443 (any other port, the platform's Redis and API among them, "
                                                     "is refused); without it it has no network at all")
    env: dict[str, str] = Field(default_factory=dict, max_length=32,
                                description="stdio only: the server's environment besides PATH, LANG, HOME and TMPDIR "
                                            "(nothing of the worker's is passed on); values are never shown back")
    read_paths: list[str] = Field(default_factory=list, max_length=32,
                                  description="stdio only: absolute paths the server may read (its code, its data), each "
                                              "at or below a folder of the operator's TOOLRAIL_MCP_STDIO_READ_ROOTS")
    side_effects: list[str] = Field(default_factory=list, max_length=256,
                                    description="remote tool names to treat as side-effecting (idempotency key, grounding)")
    read_only: list[str] = Field(default_factory=list, max_length=256,
                                 description="remote tool names the operator vouches only read (a tool is side-effecting "
                                             "unless its annotations say readOnlyHint: true, MCP's defaults)")
    requires_approval: list[str] = Field(default_factory=list, max_length=256)
    timeout_s: float = Field(default=30.0, gt=0, le=600, description="hard cap of one call")
    idle_timeout_s: float = Field(default=10.0, gt=0, le=600, description="give up after this long without progress")
    memory_mb: int = Field(default=1024, ge=64, le=16384, description="stdio only: address-space limit")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not SERVER_NAME.match(value):
            raise ValueError("a server name is 1-20 of a-z 0-9 _ - starting with a letter, without '__', not ending "
                             "in '_' (it is part of every tool name: mcp__<name>__<tool>)")
        return value

    @field_validator("url")
    @classmethod
    def _valid_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if any(ch.isspace() or ord(ch) < 32 or ord(ch) > 126 for ch in value):
            raise ValueError("the URL must be printable ASCII without spaces (IDNA-encode the host)")
        try:
            parts = urlsplit(value)
            if not parts.hostname:
                raise ValueError("the URL needs a host")
            parts.hostname.encode("idna")
            _ = parts.port  # raises on a port that is not a number in range
        except (UnicodeError, ValueError) as exc:
            raise ValueError(f"invalid URL: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> "McpServerCreate":
        if bool(self.url) == bool(self.command):
            raise ValueError("give exactly one of url (streamable HTTP) or command (stdio)")
        if self.command and any(len(part) > 4000 or "\x00" in part for part in self.command):
            raise ValueError("command parts must be at most 4000 characters, without NUL")
        if self.env and not self.command:
            raise ValueError("env is for a stdio server (command) only")
        if self.read_paths and not self.command:
            raise ValueError("read_paths is for a stdio server (command) only")
        if any(not p.startswith("/") or len(p) > 4000 or "\x00" in p for p in self.read_paths):
            raise ValueError("read_paths are absolute paths of at most 4000 characters, without NUL")
        for key, value in self.env.items():
            if not ENV_NAME.fullmatch(key) or len(value) > 4000 or "\x00" in value:
                raise ValueError("env names are 1-64 of A-Z a-z 0-9 _ (not starting with a digit); values at most "
                                 "4000 characters, without NUL")
        return self


class McpBridge:
    """What ``mount`` built: the ``/mcp`` endpoint and the periodic refresh."""

    def __init__(self, endpoint: McpEndpoint, runtime: Any, settings: Any, mcp: McpSettings) -> None:
        self.endpoint, self.runtime, self.settings, self.mcp = endpoint, runtime, settings, mcp

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager and the refresh loop, for the app's lifespan."""
        async with self.endpoint.running():
            task = None
            interval = float(self.mcp.refresh_interval_s)
            if interval > 0:
                task = asyncio.create_task(self._refresh_loop(interval))
            try:
                yield
            finally:
                if task is not None:
                    task.cancel()

    async def _refresh_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await providers.refresh_all(self.runtime, settings=self.settings, mcp=self.mcp)
            except Exception as exc:  # noqa: BLE001 - the loop outlives one bad round
                log.warning("mcp.refresh_round_failed", error=str(exc))


def mount(app: FastAPI, api: ApiContext, *, subscribe: Callable[[str], int] | None = None,
          mcp: McpSettings | None = None) -> McpBridge:
    """Add ``/mcp`` and ``/v1/mcp-servers`` to ``app`` over the job API's context ``api`` (``executor.ports``); enter
    the returned bridge's ``running()`` in the lifespan. ``subscribe(queue)`` asks the workers to consume a new
    server's queue (the runtime's queues by default); ``mcp``: the extension's settings (default: this process's)."""
    settings, runtime, tenant_dep = api.settings, api.jobs.runtime, api.tenant
    mcp = mcp or mcp_settings()
    refuse = api.error  # the API's typed error, raised
    if subscribe is None:
        subscribe = lambda queue: providers.subscribe_workers(runtime, queue)  # noqa: E731
    tenants = settings.tenants_by_key()
    service = McpService(api.jobs, settings, mcp)
    endpoint = McpEndpoint(build_server(service), tenants=tenants, rate_limiter=api.rate_limiter,
                           loopback_names=api.loopback_names, allowed_hosts=settings.allowed_hosts,
                           allowed_origins=settings.allowed_origins)
    app.router.routes.append(Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"]))
    allow_stdio = allows_stdio(settings, mcp)
    router = APIRouter(prefix="/v1/mcp-servers", tags=["mcp"])
    fetching: Counter[str] = Counter()  # registrations and refreshes in flight per tenant (this process's event loop)

    def public(record: dict[str, Any]) -> dict[str, Any]:
        keep = ("name", "url", "command", "network", "read_paths", "side_effects", "read_only", "requires_approval", "timeout_s", "idle_timeout_s",
                "memory_mb", "queue", "refused", "fetched_at")
        return {**{k: record.get(k) for k in keep}, "env": sorted(record.get("env") or {}), "tools": [
            {"name": t["name"], "remote_name": t["remote_name"], "description": t["description"],
             "side_effects": t["side_effects"], "requires_approval": t["requires_approval"],
             "parameters": t["parameters"], "output_schema": t.get("output_schema")} for t in record.get("tools", [])]}

    async def fetched(tenant: str, fetch: Callable[[], Awaitable[Any]]) -> Any:
        """``fetch()`` (a server's tools, fetched and checked): on this event loop, no thread held while the server
        takes its time, at most N per tenant at once; its errors as the API's."""
        limit = mcp.max_concurrent_per_tenant
        if fetching[tenant] >= limit:
            raise refuse(429, "mcp_registrations_busy", f"{limit} registrations or refreshes of this tenant are "
                           "in flight (TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT); retry when one ends", limit=limit)
        fetching[tenant] += 1
        try:
            return await fetch()
        except McpUrlNotAllowedError as exc:
            raise refuse(403, exc.type, str(exc), **exc.details) from None
        except McpTooLargeError as exc:
            raise refuse(422, exc.type, str(exc), **exc.details) from None
        except SandboxError as exc:  # unreachable, not starting, not speaking MCP
            raise refuse(422, "mcp_server_unavailable", str(exc), **exc.details) from None
        finally:
            fetching[tenant] -= 1

    @router.post("", status_code=201)
    async def register(body: McpServerCreate, tenant: str = tenant_dep) -> JSONResponse:
        if body.command and not allow_stdio:
            raise refuse(403, "mcp_stdio_not_allowed", "stdio MCP servers run a command on the workers; this "
                           "deployment does not allow tenants to register them (TOOLRAIL_MCP_ALLOW_STDIO)")
        try:
            config = providers.ServerConfig.build(tenant, **body.model_dump(), max_timeout_s=mcp.max_timeout_s,
                                                  read_roots=mcp.stdio_read_roots)
        except McpServerRejectedError as exc:
            raise refuse(422, exc.type, str(exc), **exc.details) from None
        existed = await asyncio.to_thread(providers.get_server, runtime.redis, tenant, body.name) is not None

        async def fetch() -> dict[str, Any]:
            taken = await asyncio.to_thread(providers.taken_names, runtime.redis, tenant, body.name)
            return await providers.fetch_and_check(dict(config), registry=runtime.registry, settings=settings,
                                                   mcp=mcp, taken=taken)

        record = await fetched(tenant, fetch)
        await asyncio.to_thread(providers.save_server, runtime.redis, record)
        workers = await asyncio.to_thread(subscribe, record["queue"])
        log.info("mcp.server_registered", tenant=tenant, server=body.name, tools=len(record["tools"]),
                 refused=len(record["refused"]), workers=workers)
        return JSONResponse({**public(record), "workers_subscribed": workers}, status_code=200 if existed else 201)

    @router.get("")
    def list_servers(tenant: str = tenant_dep) -> dict[str, Any]:
        return {"servers": [public(r) for r in providers.list_servers(runtime.redis, tenant)]}

    def _one(tenant: str, name: str) -> dict[str, Any]:
        record = providers.get_server(runtime.redis, tenant, name)
        if record is None:
            raise refuse(404, "not_found", f"no MCP server {name[:40]!r} is registered", server=name[:40])
        return record

    @router.get("/{name}")
    def get_server(name: str, tenant: str = tenant_dep) -> dict[str, Any]:
        return public(_one(tenant, name))

    @router.post("/{name}/refresh")
    async def refresh(name: str, tenant: str = tenant_dep) -> dict[str, Any]:
        await asyncio.to_thread(_one, tenant, name)
        fresh = await fetched(tenant, lambda: providers.refresh_server(runtime, tenant, name, settings=settings,
                                                                                    mcp=mcp))
        if fresh is None:  # deleted while it was fetched
            raise refuse(404, "not_found", f"no MCP server {name[:40]!r} is registered", server=name[:40])
        return public(fresh)

    @router.delete("/{name}")
    def delete(name: str, tenant: str = tenant_dep) -> dict[str, Any]:
        if not providers.delete_server(runtime.redis, tenant, name):
            raise refuse(404, "not_found", f"no MCP server {name[:40]!r} is registered", server=name[:40])
        return {"name": name, "deleted": True}

    app.include_router(router)
    bridge = McpBridge(endpoint, runtime, settings, mcp)
    app.state.lifespans.append(bridge.running)
    return bridge
