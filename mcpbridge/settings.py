"""The MCP extension's settings: ``TOOLRAIL_MCP_*``, read from the environment (docs/configuration.md lists them).

They live with the extension, not in the core's ``toolrail.settings``: the core finds them through the
``toolrail.settings`` entry point (``toolrail config docs`` and the unknown-variable warning read them there).
The API reads them when it mounts the bridge; a worker, at its first MCP call.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["McpSettings", "allows_private_urls", "allows_stdio", "mcp_settings"]


class McpSettings(BaseSettings):
    """MCP both ways: `/mcp` (toolrail's tools to MCP clients) and tenants' MCP servers (their tools to jobs)."""

    model_config = SettingsConfigDict(env_prefix="TOOLRAIL_MCP_", extra="ignore", use_attribute_docstrings=True)

    call_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """How long a `tools/call` on `/mcp` waits for its job; past it the result is `isError` naming the job,
    which goes on (`GET /v1/jobs/{id}`)."""
    connect_timeout_s: float = Field(default=10.0, gt=0, le=120)
    """Seconds to connect to an MCP server and finish the handshake (a stdio server: to start it), and to
    fetch its `tools/list`."""
    max_tools_per_server: int = Field(default=128, ge=1, le=4096)
    """Tools kept of one MCP server's `tools/list`; the rest are refused."""
    max_description_chars: int = Field(default=1024, ge=64, le=65536)
    """Characters kept of an MCP tool's description (untrusted text; always shown behind a marker naming
    its server)."""
    allow_stdio: bool | None = None
    """Whether tenants may register stdio MCP servers (a command run, confined, on the workers). Unset:
    allowed only when no API keys are configured (a one-user install)."""
    stdio_read_roots: str = ""
    """Comma-separated folders a stdio MCP server's registration may name in `read_paths` (each at or below one of
    them) for the server to read. Empty: none; a stdio server then reads only its executable, its install prefix's
    libraries and the system's. Nothing is ever inferred from the command's arguments."""
    allow_private_urls: bool | None = None
    """Whether an MCP server URL may resolve to a loopback, private or link-local address. Unset: allowed
    only when no API keys are configured."""
    max_timeout_s: float = Field(default=120.0, gt=0, le=600)
    """Ceiling on an MCP server's `timeout_s` and `idle_timeout_s` (tenant-chosen, on workers every tenant
    shares): a registration above it is refused (422 `timeout_above_ceiling`); a stored value above it
    (registered before the ceiling was lowered) is clamped at every call."""
    max_concurrent_per_tenant: int = Field(default=4, ge=1, le=1024)
    """MCP calls one tenant may have in flight across all workers (a call past it goes back to its queue
    and holds no worker), and MCP registrations and refreshes in flight per API process (429 past it)."""
    refresh_interval_s: float = Field(default=300.0, ge=0)
    """Seconds between refreshes of every registered MCP server's tools by each API process; 0: off
    (`notifications/tools/list_changed` and `POST /v1/mcp-servers/{name}/refresh` still refresh)."""


@lru_cache(maxsize=1)
def mcp_settings() -> McpSettings:
    """The settings from this process's environment, read once (``mcp_settings.cache_clear()`` reads them again)."""
    return McpSettings()


def allows_stdio(settings: Any, mcp: McpSettings) -> bool:
    """Whether tenants may register stdio servers (unset: only on an install without API keys)."""
    return mcp.allow_stdio if mcp.allow_stdio is not None else not settings.tenants_by_key()


def allows_private_urls(settings: Any, mcp: McpSettings) -> bool:
    """Whether a server URL may resolve to a private address (unset: only on an install without API keys)."""
    return mcp.allow_private_urls if mcp.allow_private_urls is not None else not settings.tenants_by_key()
