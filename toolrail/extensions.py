"""Installed extensions of the platform, found by entry point (``importlib.metadata``).

Three groups, each a seam the executor owns and an extension fills:

- ``toolrail.api``: ``mount(app, api)`` adds routes to the job API, given its context
  (``executor.ports.ApiContext``: settings, jobs, tenant, errors, rate limit; mcpbridge's ``/mcp`` and
  ``/v1/mcp-servers``);
- ``toolrail.tool_sources``: a source of tools beyond the registry (``executor.ports.ToolSource``), each with the
  sandbox that runs its calls (mcpbridge's MCP servers: an MCP tool is run by its server's client, not the process sandbox);
- ``toolrail.settings``: an extension's own settings class (a pydantic ``BaseSettings`` with its own
  ``TOOLRAIL_<NAME>_`` prefix; mcpbridge's ``TOOLRAIL_MCP_*``), listed by ``toolrail config docs`` and known to
  the unknown-variable warning.

So the API and the run loop never import an extension: one points at the other only through here.
"""

from __future__ import annotations

from functools import cache
from importlib import metadata
from typing import Any

__all__ = ["API_GROUP", "SETTINGS_GROUP", "TOOL_SOURCES_GROUP", "installed"]

API_GROUP = "toolrail.api"
TOOL_SOURCES_GROUP = "toolrail.tool_sources"
SETTINGS_GROUP = "toolrail.settings"


@cache
def installed(group: str) -> tuple[Any, ...]:
    """The loaded objects of ``group``'s entry points, in name order (loaded once per process)."""
    points = sorted(metadata.entry_points(group=group), key=lambda point: point.name)
    return tuple(point.load() for point in points)
