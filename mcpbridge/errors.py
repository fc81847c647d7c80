"""Errors of the MCP bridge, each naming the server and the tool.

    ConcurrencyLimitedError (executor.ports, retryable)
    └── McpTenantLimitError        the tenant's MCP calls in flight at its limit: a few short retries, then the
                                   call ends with it (typed, seconds), never ``internal_error`` after ~30 s

    PermanentError (executor.errors)
    ├── McpServerRejectedError     a registration refused: bad name, unreachable, nothing usable listed
    ├── McpToolRejectedError       one listed tool refused (schema, name, collision); ``details.path``
    └── SandboxError               a call of an MCP-provided tool that ended badly
        ├── McpUnavailableError    the server cannot be reached or started (counts against its breaker)
        │   └── McpUrlNotAllowedError  its host resolved to an address the SSRF guard refuses (toolrail.netguard)
        ├── McpProtocolError       the server broke the protocol (garbage on stdout, a malformed reply)
        ├── McpServerExitedError   the server (stdio) exited or hung up mid-call
        ├── McpTimeoutError        (a ``ToolTimeoutError``) no progress for the idle limit, or past the hard cap
        ├── McpOutputError         (a ``ToolOutputError``) a result that does not match the tool's ``outputSchema``
        │   └── McpTooLargeError   an answer or a listing past its limit (``details.limit_bytes``), cut unread
        └── ToolRaisedError        an ``isError`` result: the tool's own answer (``details.tool_error``)

Every error carries ``server`` and ``tool`` in ``details`` (the tool's remote name; ``tool_name`` is the
prefixed name the platform knows it by).
"""

from __future__ import annotations

from executor.errors import PermanentError, SandboxError, ToolOutputError, ToolTimeoutError
from executor.ports import ConcurrencyLimitedError

__all__ = [
    "McpOutputError",
    "McpProtocolError",
    "McpServerExitedError",
    "McpServerRejectedError",
    "McpTenantLimitError",
    "McpTimeoutError",
    "McpTooLargeError",
    "McpToolRejectedError",
    "McpUnavailableError",
    "McpUrlNotAllowedError",
]


class McpTenantLimitError(ConcurrencyLimitedError):
    """The tenant has ``limit`` MCP calls in flight (``TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT``): the call goes back to
    its queue ``max_retries`` times (a second or two each), then ends with this error."""

    type = "mcp_tenant_limit"
    max_retries = 3


class McpServerRejectedError(PermanentError):
    """A server registration was refused (``details``: server and why)."""

    type = "mcp_server_rejected"


class McpToolRejectedError(PermanentError):
    """A tool a server listed was refused (``details``: server, tool, path, reason)."""

    type = "mcp_tool_rejected"


class McpUnavailableError(SandboxError):
    """The server could not be reached or started."""

    type = "mcp_unavailable"


class McpProtocolError(SandboxError):
    """The server broke the protocol: not JSON-RPC on stdout, a malformed or unexpected reply."""

    type = "mcp_protocol_error"


class McpServerExitedError(SandboxError):
    """The server exited or closed the connection while a call was in flight."""

    type = "mcp_server_exited"


class McpTimeoutError(ToolTimeoutError):
    """No answer in time: ``details.limit`` is ``idle`` (no progress for that long) or ``hard`` (the cap)."""


class McpOutputError(ToolOutputError):
    """The result does not match the tool's declared ``outputSchema`` (``details.errors``)."""


class McpTooLargeError(McpOutputError):
    """An answer past its limit: a call's result over the sandbox's 1 MB, a ``tools/list`` over 16 MiB."""

    type = "mcp_too_large"


class McpUrlNotAllowedError(McpUnavailableError):
    """The server's host resolved (at this connection) to an address the SSRF guard refuses."""

    type = "mcp_url_not_allowed"
