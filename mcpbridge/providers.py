"""MCP servers as tool providers: per-tenant records in Redis, their checked tools, refresh.

    tr:mcp:servers:<tenant>   hash: server name → JSON record (endpoint, limits, operator flags,
                              the checked tools, the refused ones with their reasons, fetched_at)
    tr:mcp:queues             set: the worker queue of every registered server (``mcp.<tenant>.<server>``)

A record is written only after the server answered ``tools/list`` and its tools were checked
(:func:`mcpbridge.spec.check_listed_tool`); a tool that fails is kept out, with its path and reason
in ``refused`` — among them a tool whose name another server of the tenant already provides
(``name_collision``: nothing silently wins). ``specs_for`` turns a tenant's records back into :class:`~mcpbridge.spec.McpToolSpec`s
for the job path (``executor.runs.loop.job_specs``) and ``GET /v1/tools``. ``refresh_server`` re-fetches
one server (after a ``notifications/tools/list_changed``, on ``POST /v1/mcp-servers/{name}/refresh``
and periodically from the API process); a server that cannot be reached keeps its last good list.
Fetching is async and holds no thread while a server takes its time (registration runs on the API's
event loop, not its thread pool).

The operator's policy (``mcpbridge.settings``): whether stdio servers and private URLs are allowed,
the ceiling on a server's timeouts (``TOOLRAIL_MCP_MAX_TIMEOUT_S``: a registration
above it is refused, a stored value above it is clamped at call time).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import anyio
import redis

from executor.ports import Runtime
from mcpbridge.errors import McpServerRejectedError, McpToolRejectedError
from mcpbridge.session import Endpoint, list_tools
from mcpbridge.settings import McpSettings, allows_private_urls, mcp_settings
from mcpbridge.spec import SERVER_NAME, McpToolSpec, check_listed_tool
from toolrail.logging import get_logger
from tools.errors import UnknownToolError

__all__ = [
    "QUEUES_KEY",
    "ServerConfig",
    "delete_server",
    "fetch_and_check",
    "get_server",
    "known_queues",
    "list_servers",
    "queue_for",
    "refresh_all",
    "refresh_server",
    "save_server",
    "specs_for",
    "subscribe_workers",
    "taken_names",
    "timeouts",
]

log = get_logger("toolrail.mcp.providers")

QUEUES_KEY = "tr:mcp:queues"


def _servers_key(tenant: str) -> str:
    return f"tr:mcp:servers:{tenant}"


def timeouts(record: dict[str, Any], mcp: McpSettings) -> tuple[float, float]:
    """A server's (hard, idle) call timeouts under the operator's ceiling ``TOOLRAIL_MCP_MAX_TIMEOUT_S``."""
    ceiling = float(mcp.max_timeout_s)
    return min(float(record["timeout_s"]), ceiling), min(float(record["idle_timeout_s"]), ceiling)


def queue_for(tenant: str, server: str) -> str:
    """The worker queue of one tenant's server: a slow server holds only its own workers."""
    return f"mcp.{tenant}.{server}"


def checked_read_paths(name: str, paths: list[str] | tuple[str, ...], roots: str) -> list[str]:
    """``paths`` (a stdio server's ``read_paths``) when each is at or below a folder of ``roots``
    (``TOOLRAIL_MCP_STDIO_READ_ROOTS``, resolved: a symlink cannot lead out); else ``McpServerRejectedError``
    (``read_path_not_allowed``)."""
    allowed = [os.path.realpath(r.strip()) for r in roots.split(",") if r.strip().startswith("/")]
    for path in paths:
        real = os.path.realpath(path)
        if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in allowed):
            raise McpServerRejectedError(f"MCP server {name!r}: read path {path!r} is not under a folder this deployment "
                                         "lets stdio servers read (TOOLRAIL_MCP_STDIO_READ_ROOTS)", server=name,
                                         reason="read_path_not_allowed", path=path)
    return list(dict.fromkeys(paths))


class ServerConfig(dict):
    """A server record before its tools are fetched: name, url | command, limits and operator flags."""

    @classmethod
    def build(cls, tenant: str, *, name: str, url: str | None = None, command: list[str] | None = None,
              network: bool = False, side_effects: list[str] = (), read_only: list[str] = (),
              requires_approval: list[str] = (),
              timeout_s: float = 30.0, idle_timeout_s: float = 10.0, memory_mb: int = 1024,
              max_timeout_s: float | None = None, env: dict[str, str] | None = None, read_paths: list[str] = (),
              read_roots: str = "") -> "ServerConfig":
        if not SERVER_NAME.match(name or ""):
            raise McpServerRejectedError(f"server name {name!r} must be 1-20 of a-z 0-9 _ - (starting with a letter, "
                                         "no '__', not ending in '_')", server=name, reason="invalid_name")
        for field, value in (("timeout_s", timeout_s), ("idle_timeout_s", idle_timeout_s)):
            if max_timeout_s is not None and float(value) > max_timeout_s:
                raise McpServerRejectedError(f"MCP server {name!r}: {field} {float(value):g} s is above this "
                                             f"deployment's ceiling of {max_timeout_s:g} s "
                                             "(TOOLRAIL_MCP_MAX_TIMEOUT_S)",
                                             server=name, reason="timeout_above_ceiling", field=field,
                                             ceiling_s=max_timeout_s)
        if bool(url) == bool(command):
            raise McpServerRejectedError(f"MCP server {name!r}: give exactly one of url or command", server=name,
                                         reason="url_or_command")
        readable = checked_read_paths(name, read_paths, read_roots) if command else []
        return cls(name=name, tenant=tenant, url=url, command=list(command) if command else None, read_paths=readable,
                   network=bool(network) if command else True, side_effects=sorted(set(side_effects)),
                   read_only=sorted(set(read_only) - set(side_effects)),
                   requires_approval=sorted(set(requires_approval)), timeout_s=float(timeout_s),
                   idle_timeout_s=float(idle_timeout_s), memory_mb=int(memory_mb), queue=queue_for(tenant, name),
                   env=dict(env or {}) if command else {})

    def endpoint(self, *, allow_private: bool) -> Endpoint:
        raw = {"url": self["url"]} if self.get("url") else {"command": self["command"], "network": self["network"],
                                                            "env": self.get("env") or {},
                                                            "read_paths": self.get("read_paths") or []}
        return Endpoint.of(self["name"], raw, memory_mb=int(self.get("memory_mb", 1024)),
                           cpu_s=int(self.get("timeout_s", 30)) + 30, allow_private=allow_private)


async def fetch_and_check(config: dict[str, Any], *, registry: Any, settings: Any, mcp: McpSettings | None = None,
                          taken: dict[str, str] | None = None) -> dict[str, Any]:
    """``tools/list`` of the server, every tool checked: the full record (``tools`` and ``refused``).

    ``taken``: tool name → the other server of the tenant that provides it (such a tool is refused).
    """
    mcp = mcp or mcp_settings()
    endpoint = ServerConfig(config).endpoint(allow_private=allows_private_urls(settings, mcp))
    listed = await list_tools(endpoint, timeout_s=float(mcp.connect_timeout_s))
    return await anyio.to_thread.run_sync(lambda: _checked_record(config, listed, registry=registry, settings=settings,
                                                                  mcp=mcp, taken=taken or {}))


def _checked_record(config: dict[str, Any], listed: list[dict[str, Any]], *, registry: Any, settings: Any,
                    mcp: McpSettings, taken: dict[str, str]) -> dict[str, Any]:
    server = config["name"]
    limit = int(mcp.max_tools_per_server)
    tools, refused, seen = [], [], set()
    for index, raw in enumerate(listed):
        if index >= limit:
            refused.append({"type": "mcp_tool_rejected", "message": f"MCP server {server!r} lists more than {limit} "
                            "tools; the rest are ignored", "details": {"server": server, "path": f"/tools/{index}",
                                                                       "reason": "too_many_tools"}})
            break
        try:
            tool = check_listed_tool(server, index, raw, registry=registry, side_effects=set(config["side_effects"]),
                                     read_only=set(config.get("read_only") or ()),
                                     approval=set(config["requires_approval"]),
                                     max_description_chars=int(mcp.max_description_chars),
                                     max_schema_bytes=int(settings.max_schema_bytes),
                                     max_schema_depth=int(settings.max_schema_depth))
            if tool["name"] in seen:
                raise McpToolRejectedError(f"MCP server {server!r} lists tool {tool['remote_name']!r} twice",
                                           server=server, tool=tool["remote_name"], path=f"/tools/{index}/name",
                                           reason="duplicate")
            if tool["name"] in taken:
                raise McpToolRejectedError(f"MCP server {server!r}, tool {tool['remote_name']!r}: {tool['name']!r} is "
                                           f"already a tool of MCP server {taken[tool['name']]!r}", server=server,
                                           tool=tool["remote_name"], path=f"/tools/{index}/name",
                                           reason="name_collision", other_server=taken[tool["name"]])
        except McpToolRejectedError as exc:
            refused.append(exc.to_dict())
            log.warning("mcp.tool_refused", server=server, **{k: v for k, v in exc.details.items() if k != "server"})
            continue
        seen.add(tool["name"])
        tools.append(tool)
    return {**config, "tools": tools, "refused": refused, "fetched_at": time.time()}


def save_server(client: redis.Redis, record: dict[str, Any]) -> None:
    pipe = client.pipeline()
    pipe.hset(_servers_key(record["tenant"]), record["name"], json.dumps(record, ensure_ascii=False))
    pipe.sadd(QUEUES_KEY, record["queue"])
    pipe.execute()


def get_server(client: redis.Redis, tenant: str, name: str) -> dict[str, Any] | None:
    raw = client.hget(_servers_key(tenant), name)
    return json.loads(raw) if raw else None


def list_servers(client: redis.Redis, tenant: str) -> list[dict[str, Any]]:
    return [json.loads(v) for _, v in sorted(client.hgetall(_servers_key(tenant)).items())]


def delete_server(client: redis.Redis, tenant: str, name: str) -> bool:
    record = get_server(client, tenant, name)
    if record is None:
        return False
    pipe = client.pipeline()
    pipe.hdel(_servers_key(tenant), name)
    pipe.srem(QUEUES_KEY, record["queue"])
    pipe.execute()
    return True


def known_queues(client: redis.Redis) -> list[str]:
    """Every registered server's queue (what a worker started now should consume)."""
    return sorted(q.decode() if isinstance(q, bytes) else q for q in client.smembers(QUEUES_KEY))


def subscribe_workers(rt: Runtime, queue: str) -> int:
    """Ask every running worker to consume ``queue`` (through the runtime's queues); replies counted."""
    try:
        return rt.queues.subscribe(queue) if rt.queues is not None else 0
    except Exception as exc:  # noqa: BLE001 - no broker: workers started later pick the queue up from Redis
        log.warning("mcp.subscribe_failed", queue=queue, error=str(exc))
        return 0


def taken_names(client: redis.Redis, tenant: str, server: str) -> dict[str, str]:
    """Tool name → server, over the tenant's servers other than ``server`` (a new tool of that name clashes)."""
    return {tool["name"]: record["name"] for record in list_servers(client, tenant) if record["name"] != server
            for tool in record.get("tools", [])}


def specs_for(client: redis.Redis, tenant: str, names: list[str] | None = None) -> dict[str, McpToolSpec]:
    """The tenant's MCP tools as specs (all, or ``names``; an unknown name is ``UnknownToolError``).

    A name two stored servers provide (records from before clashes were refused) is left out: neither wins.
    """
    specs: dict[str, McpToolSpec] = {}
    clashing: set[str] = set()
    for record in list_servers(client, tenant):
        for tool in record.get("tools", []):
            if tool["name"] in specs or tool["name"] in clashing:
                clashing.add(tool["name"])
                specs.pop(tool["name"], None)
                log.warning("mcp.tool_name_clash", tenant=tenant, tool=tool["name"], server=record["name"])
            elif names is None or tool["name"] in names:
                specs[tool["name"]] = McpToolSpec.from_record(tenant, record, tool)
    if names is not None:
        missing = [n for n in names if n not in specs]
        if missing:
            raise UnknownToolError(f"unknown tool {missing[0]!r}", tool=missing[0], known=sorted(specs))
    return specs


async def refresh_server(rt: Any, tenant: str, name: str, *, settings: Any = None,
                         mcp: McpSettings | None = None) -> dict[str, Any] | None:
    """Re-fetch and re-check one server's tools; the record as stored (None if the server is gone).

    ``settings``, ``mcp``: the policy to fetch under (the API's own), else the runtime's and the process's."""
    record = await anyio.to_thread.run_sync(get_server, rt.redis, tenant, name)
    if record is None:
        return None
    config = {k: v for k, v in record.items() if k not in {"tools", "refused", "fetched_at"}}
    taken = await anyio.to_thread.run_sync(taken_names, rt.redis, tenant, name)
    fresh = await fetch_and_check(config, registry=rt.registry, settings=settings or rt.settings,
                                  mcp=mcp, taken=taken)
    if await anyio.to_thread.run_sync(get_server, rt.redis, tenant, name) is None:  # deleted while fetching
        return None
    await anyio.to_thread.run_sync(save_server, rt.redis, fresh)
    before = {t["name"] for t in record.get("tools", [])}
    after = {t["name"] for t in fresh["tools"]}
    log.info("mcp.refreshed", tenant=tenant, server=name, added=sorted(after - before), removed=sorted(before - after))
    return fresh


async def refresh_all(rt: Any, *, settings: Any = None, mcp: McpSettings | None = None) -> int:
    """Refresh every tenant's servers (the API's periodic refresh); a server that fails keeps its last list."""
    done = 0

    def servers() -> list[tuple[str, str]]:
        found = []
        for key in rt.redis.scan_iter(match=_servers_key("*"), count=100):
            tenant = (key.decode() if isinstance(key, bytes) else key).split(":", 3)[3]
            found += [(tenant, n.decode() if isinstance(n, bytes) else n) for n in rt.redis.hkeys(key)]
        return found

    for tenant, name in await anyio.to_thread.run_sync(servers):
        try:
            await refresh_server(rt, tenant, name, settings=settings, mcp=mcp)
            done += 1
        except Exception as exc:  # noqa: BLE001 - one server down must not stop the others' refresh
            log.warning("mcp.refresh_failed", tenant=tenant, server=name, error=str(exc))
    return done
