"""MCP-provided tools as ``ToolSpec``s: names, the schema check, untrusted descriptions.

A tool listed by a tenant's MCP server becomes an :class:`McpToolSpec` named
``mcp__<server>__<tool>`` (``tool_name``), so it can never shadow a local tool; a prefixed name that
still collides with a registered one is refused. Each listed tool passes the checks a client's
inline tool passes (``tools.schema_guard.check_client_schema``: no ``$ref`` loops or remote refs,
size and depth bounded, patterns RE2 can run; the metaschema; ``additionalProperties: false`` added
everywhere), and its ``outputSchema`` the same bounds. A refused tool is an
:class:`~mcpbridge.errors.McpToolRejectedError` with the JSON pointer at fault; the server's other
tools are kept.

Descriptions come from a server the platform does not control: they are cut to a bounded length,
stripped of control characters and always carry a visible marker naming the server
(``[MCP server 'x', untrusted]``) wherever they are shown to a model.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from jsonschema.exceptions import SchemaError
from pydantic import Field

from mcpbridge.errors import McpToolRejectedError
from tools.errors import SchemaRejectedError
from tools.registry import Registry
from tools.schema_guard import check_client_schema
from tools.spec import ToolSpec, strict_schema
from tools.validator import validator_for

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "McpToolSpec",
    "SERVER_NAME",
    "check_listed_tool",
    "tool_name",
    "untrusted_description",
]

#: Server names: short, lower case; they are part of every tool name and queue name. No ``__`` and no trailing
#: ``_``, so that ``mcp__<server>__<tool>`` names one (server, tool) pair only.
SERVER_NAME = re.compile(r"^(?!.*__)[a-z][a-z0-9_-]{0,19}(?<!_)$")
#: Remote tool names the platform accepts (MCP allows the same characters).
_REMOTE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PREFIX = "mcp__"
MAX_DESCRIPTION_CHARS = 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def tool_name(server: str, remote: str) -> str:
    """The platform's name for ``remote`` of ``server``: ``mcp__<server>__<remote>``."""
    return f"{PREFIX}{server}__{remote}"


def untrusted_description(server: str, text: Any, *, max_chars: int = MAX_DESCRIPTION_CHARS) -> str:
    """``text`` cut to ``max_chars``, control and format characters removed, behind the server's marker."""
    raw = text if isinstance(text, str) else ""
    clipped = raw[: max_chars * 4]  # bound the work before normalizing: a 10 MB description costs nothing
    clipped = "".join(ch for ch in _CONTROL.sub(" ", clipped) if unicodedata.category(ch) != "Cf")
    clipped = " ".join(clipped.split())
    if len(clipped) > max_chars or len(raw) > max_chars * 4:
        clipped = clipped[:max_chars].rstrip() + f" […cut: {len(raw)} chars]"
    return f"[MCP server {server!r}, untrusted] {clipped}".rstrip()


class McpToolSpec(ToolSpec):
    """A tool of a tenant's MCP server: a ``ToolSpec`` plus what the MCP client needs to call it."""

    server: str
    remote_name: str
    tenant: str
    #: ``{"url": ...}`` (streamable HTTP) or ``{"command": [...], "network": ..., "env": {...}, "read_paths": [...]}``
    #: (stdio, sandboxed).
    endpoint: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    #: Seconds without a progress report before a call is given up (``timeout_s`` is the hard cap).
    idle_timeout_s: float = 10.0
    annotations: dict[str, Any] = Field(default_factory=dict)

    @property
    def breaker_name(self) -> str:
        """The circuit breaker key: one per server (a server that is down fails all its tools fast)."""
        return f"mcp:{self.server}"

    def public(self) -> dict[str, Any]:
        out = super().public()
        out.update({"source": f"mcp:{self.server}", "server": self.server, "remote_name": self.remote_name,
                    "output_schema": self.output_schema, "idle_timeout_s": self.idle_timeout_s,
                    "transport": "streamable_http" if "url" in self.endpoint else "stdio"})
        return out

    @classmethod
    def from_record(cls, tenant: str, server: dict[str, Any], tool: dict[str, Any]) -> "McpToolSpec":
        """Rebuild a spec from a stored server record and one of its checked tools."""
        endpoint = {"url": server["url"]} if server.get("url") else {"command": list(server["command"]),
                                                                    "network": bool(server.get("network")),
                                                                    "env": dict(server.get("env") or {}),
                                                                    "read_paths": list(server.get("read_paths") or [])}
        return cls(name=tool["name"], description=tool["description"], parameters=tool["parameters"],
                   side_effects=tool["side_effects"], requires_approval=tool["requires_approval"],
                   timeout_s=float(server["timeout_s"]), idle_timeout_s=float(server["idle_timeout_s"]),
                   memory_mb=int(server.get("memory_mb", 1024)), networked=bool(server.get("network")),
                   queue=server["queue"], entrypoint=f"mcp://{server['name']}/{tool['remote_name']}",
                   server=server["name"], remote_name=tool["remote_name"], tenant=tenant, endpoint=endpoint,
                   output_schema=tool.get("output_schema"), annotations=tool.get("annotations") or {})


def _schema(server: str, remote: str, schema: Any, path: str, *, max_bytes: int, max_depth: int) -> dict[str, Any]:
    try:
        check_client_schema(schema, path=path, max_bytes=max_bytes, max_depth=max_depth)
        if not isinstance(schema, dict):
            raise SchemaRejectedError(path, "a tool schema must be a JSON object", reason="not_an_object")
        validator_for(schema)
    except SchemaRejectedError as exc:
        raise McpToolRejectedError(f"MCP server {server!r}, tool {remote!r}: {exc}", server=server, tool=remote,
                                   path=exc.details.get("path", path),
                                   reason=exc.details.get("reason", exc.type)) from None
    except SchemaError as exc:
        where = path + "".join(f"/{p}" for p in exc.path)
        raise McpToolRejectedError(f"MCP server {server!r}, tool {remote!r}: invalid schema at {where}: {exc.message}",
                                   server=server, tool=remote, path=where, reason="invalid_schema") from None
    return schema


def check_listed_tool(server: str, index: int, tool: dict[str, Any], *, registry: Registry, side_effects: set[str],
                      read_only: set[str] = frozenset(),
                      approval: set[str], max_description_chars: int = MAX_DESCRIPTION_CHARS,
                      max_schema_bytes: int = 64 * 1024, max_schema_depth: int = 24) -> dict[str, Any]:
    """One tool of a ``tools/list`` answer, checked: the stored form, or ``McpToolRejectedError``.

    ``side_effects``, ``read_only`` and ``approval`` are the operator's flags (remote names); a tool whose
    annotations do not say ``readOnlyHint: true`` is side-effecting too (the MCP spec's defaults:
    ``readOnlyHint`` false, ``destructiveHint`` true), so every string and number of its calls is covered,
    unless the operator vouches that it only reads (``read_only``; ``side_effects`` wins over it).
    """
    base = f"/tools/{index}"
    remote = tool.get("name")
    if not isinstance(remote, str) or not _REMOTE_NAME.match(remote):
        shown = remote[:80] if isinstance(remote, str) else remote
        raise McpToolRejectedError(f"MCP server {server!r}: tool name {shown!r} is not 1-64 letters, digits, _ . -",
                                   server=server, tool=shown, path=f"{base}/name", reason="invalid_name")
    name = tool_name(server, remote)
    if len(name) > 64:
        raise McpToolRejectedError(f"MCP server {server!r}, tool {remote!r}: the prefixed name {name!r} is longer "
                                   "than 64 characters", server=server, tool=remote, path=f"{base}/name",
                                   reason="name_too_long")
    if name in registry:
        raise McpToolRejectedError(f"MCP server {server!r}, tool {remote!r}: {name!r} collides with a local tool",
                                   server=server, tool=remote, path=f"{base}/name", reason="name_collision")
    limits = {"max_bytes": max_schema_bytes, "max_depth": max_schema_depth}
    params = _schema(server, remote, tool.get("inputSchema", {"type": "object"}), f"{base}/inputSchema", **limits)
    if params.get("type", "object") != "object":
        raise McpToolRejectedError(f"MCP server {server!r}, tool {remote!r}: inputSchema must be of type object",
                                   server=server, tool=remote, path=f"{base}/inputSchema/type", reason="not_an_object")
    output = tool.get("outputSchema")
    if output is not None:
        output = _schema(server, remote, output, f"{base}/outputSchema", **limits)
    annotations = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else {}
    # MCP's defaults: readOnlyHint false, destructiveHint true: a tool that does not say it only reads may change things
    destructive = annotations.get("readOnlyHint") is not True and remote not in read_only
    strict = strict_schema(params)
    strict.setdefault("type", "object")
    try:  # the spec's own checks (x-grounded declarations) on the strict form
        ToolSpec(name=name, parameters=strict)
    except ValueError as exc:
        raise McpToolRejectedError(f"MCP server {server!r}, tool {remote!r}: {exc}", server=server, tool=remote,
                                   path=f"{base}/inputSchema", reason="invalid_schema") from None
    return {"name": name, "remote_name": remote, "parameters": strict, "output_schema": output,
            "description": untrusted_description(server, tool.get("description"), max_chars=max_description_chars),
            "side_effects": destructive or remote in side_effects, "requires_approval": remote in approval,
            "annotations": {k: annotations[k] for k in ("title", "readOnlyHint", "destructiveHint", "idempotentHint",
                                                        "openWorldHint") if k in annotations}}
