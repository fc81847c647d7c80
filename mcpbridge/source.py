"""The tenant's MCP servers as a tool source of the run loop (the ``toolrail.tool_sources`` entry point).

The loop asks every source for the tools a job names beyond the registry, and the source of a spec
for the sandbox that runs it: an MCP tool is run by its server's client (``mcpbridge.client``), with
the same call boundary as the process sandbox (``run(spec, call) -> SandboxResult``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from executor.ports import CallRun, Runtime, SandboxResult

__all__ = ["MCP_TOOLS", "McpToolSource"]


def _bridge() -> tuple[Any, Any]:
    """``mcpbridge.providers`` and ``mcpbridge.client``, loaded at the first MCP tool asked for."""
    from mcpbridge import client, providers  # lazy: the MCP SDK loads only in a process asked for MCP tools

    return providers, client


class McpToolSource:
    """Tools that a tenant's registered MCP servers provide."""

    def specs(self, rt: Runtime, tenant: str, names: list[str] | None = None) -> dict[str, Any]:
        providers, _ = _bridge()
        return providers.specs_for(rt.redis, tenant, names)

    def queues(self, client: Any) -> list[str]:
        """Every registered server's queue (each server's calls run on a queue of its own)."""
        providers, _ = _bridge()
        return providers.known_queues(client)

    def owns(self, spec: Any) -> bool:
        return getattr(spec, "server", None) is not None

    def admit(self, rt: Runtime, spec: Any) -> AbstractContextManager[None]:
        """One of the tenant's MCP call slots, held from before the call's idempotency lock to its end."""
        _, client = _bridge()
        return client.tenant_slot(rt, spec)

    def run(self, rt: Runtime, spec: Any, call: CallRun) -> SandboxResult:
        _, client = _bridge()
        return client.run_call(rt, spec, call)


MCP_TOOLS = McpToolSource()
