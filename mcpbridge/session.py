"""One MCP connection: connect (streamable HTTP or a confined stdio child), list tools, call one; typed errors.

A connection is the official SDK's ``Client`` (handshake-era protocol, so that
``notifications/tools/list_changed`` arrives unasked): streamable HTTP to a URL through
:mod:`mcpbridge.transport` (the SSRF guard at every request, bodies bounded), or a stdio child started
confined by :mod:`executor.sandbox.launch` in a scratch directory of its own, removed with the connection.
``list_tools`` and ``call_tool`` open one for the operation; a worker's calls (:mod:`mcpbridge.client`)
reuse the open sessions of :mod:`mcpbridge.pool`.

What a server may send is bounded as a local tool's output is: a ``tools/list`` answer
``MAX_LISTING_BYTES`` (16 MiB), a call's answer ``MAX_CALL_BYTES`` on the wire (its result, which
servers send twice — ``content`` text and ``structuredContent`` — plus the envelope) and its result
``MAX_RESULT_BYTES`` (1 MB, the sandbox's cap) once decoded. Past a limit: ``McpTooLargeError``.

A call ends in one of:

- a ``CallToolResult`` without ``isError`` whose ``structuredContent`` matches the tool's
  ``outputSchema`` (when it declares one) → the result as JSON;
- ``isError: true`` → ``ToolRaisedError`` (``details.tool_error.type == "mcp_tool_error"``: the tool's
  answer, which does not count against the server's breaker);
- no progress report for ``idle_timeout_s``, or past the hard cap ``timeout_s`` →
  :class:`~mcpbridge.errors.McpTimeoutError` (a progress report resets the idle timer, never the cap);
- the server unreachable or not starting → ``McpUnavailableError`` (``McpUrlNotAllowedError`` when its
  host resolves to an address the guard refuses); a line on stdout that is not JSON-RPC →
  ``McpProtocolError``; the server exiting or hanging up mid-call → ``McpServerExitedError``; a result
  off its ``outputSchema`` → ``McpOutputError``; an answer past its limit → ``McpTooLargeError``.

Every error names the server and the tool.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from executor.errors import SandboxError, ToolRaisedError
from executor.ports import LAUNCHER, MAX_RESULT_BYTES
from mcpbridge.errors import (McpOutputError, McpProtocolError, McpServerExitedError, McpTimeoutError, McpTooLargeError,
                              McpUnavailableError, McpUrlNotAllowedError)
from mcpbridge.transport import guarded_client
from toolrail.netguard import UrlRefusedError
from tools.validator import validation_errors

__all__ = ["Endpoint", "MAX_CALL_BYTES", "MAX_LISTING_BYTES", "MAX_RESULT_BYTES", "META_PREFIX", "Trouble",
           "call_error", "call_tool", "checked_result", "connect", "invoke", "list_tools"]

#: Namespace of the keys toolrail puts in ``_meta`` (idempotency key, job, call and request ids).
META_PREFIX = "toolrail.dev/"
#: The largest ``tools/list`` answer taken from an HTTP server (descriptions are cut after).
MAX_LISTING_BYTES = 16 * 1024 * 1024
#: The largest answer to one call on the wire: its result twice (``content`` text and ``structuredContent``)
#: and the envelope; the decoded result is held to ``MAX_RESULT_BYTES``.
MAX_CALL_BYTES = 2 * MAX_RESULT_BYTES + 64 * 1024
#: Bytes of a stdio server's stderr kept for error messages.
_STDERR_TAIL = 2000


@dataclass(frozen=True)
class Endpoint:
    """Where a server is: ``url`` (streamable HTTP) or ``command`` (stdio), and a stdio server's limits.

    ``allow_private``: the operator lets a URL's host resolve to a non-public address (``mcpbridge.policy``).
    """

    server: str
    url: str | None = None
    command: tuple[str, ...] = ()
    network: bool = False
    memory_mb: int = 1024
    cpu_s: int = 120
    allow_private: bool = False
    #: The variables the registration declares for a stdio server (its whole environment but PATH, LANG, HOME, TMPDIR).
    env: tuple[tuple[str, str], ...] = ()
    #: What a stdio server may read besides its program and the system's libraries: its registration's ``read_paths``.
    read_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, server: str, endpoint: dict[str, Any], *, memory_mb: int = 1024, cpu_s: int = 120,
           allow_private: bool = False) -> "Endpoint":
        return cls(server=server, url=endpoint.get("url"), command=tuple(endpoint.get("command") or ()),
                   network=bool(endpoint.get("network")), memory_mb=memory_mb, cpu_s=cpu_s, allow_private=allow_private,
                   env=tuple(sorted((endpoint.get("env") or {}).items())),
                   read_paths=tuple(endpoint.get("read_paths") or ()))


@dataclass
class Trouble:
    """What went wrong under the session: a malformed line, a change notice, an answer past its limit, stderr."""

    protocol: Exception | None = None
    list_changed: bool = False
    too_large: int | None = None
    stderr_kept: str | None = None  # the tail as it was when the connection's scratch directory was removed
    stderr_path: str | None = None
    activity: float = field(default_factory=time.monotonic)

    def exit_code(self) -> int | None:
        """How a stdio server's process ended, as its relay said (``executor.sandbox.launch``'s last line), if it did."""
        found = re.findall(re.escape(LAUNCHER.exit_line) + r" (-?\d{1,3})\b", self.stderr_tail()) if self.stderr_path else []
        return int(found[-1]) if found else None

    def ended(self) -> str:
        """How the process ended, in the platform's words: never a word the server printed."""
        code = self.exit_code()
        if code is None:
            return ""
        if code == 126:
            return "; the sandbox could not be set up for it (exit 126)"
        if code == 127:
            return "; its command could not be started (exit 127)"
        return f"; its process was killed by signal {-code}" if code < 0 else f"; its process exited with code {code}"

    def limit_hit(self) -> int | None:
        """The limit an answer went past: cut by the HTTP transport, or a stdio server stopped by its relay."""
        if self.too_large is None and self.stderr_path:
            found = re.search(re.escape(LAUNCHER.line_too_long) + r" (\d+) bytes", self.stderr_tail())
            self.too_large = int(found.group(1)) if found else None
        return self.too_large

    def stderr_tail(self) -> str:
        if self.stderr_kept is not None or not self.stderr_path:
            return self.stderr_kept or ""
        try:
            with open(self.stderr_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - _STDERR_TAIL))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""


@asynccontextmanager
async def _watched(transport: Any, trouble: Trouble) -> AsyncIterator[Any]:
    """The transport's streams, with a malformed inbound message ending the connection (recorded in ``trouble``).

    The SDK hands a line it cannot parse to the session as an exception and carries on, so a call
    would wait for its timeout; here the first one closes the read side, and the pending request
    fails at once.
    """
    async with transport as (read, write):
        send, receive = anyio.create_memory_object_stream[Any](16)

        async def pump() -> None:
            async with send:
                async for item in read:
                    if isinstance(item, Exception):
                        trouble.protocol = item
                        return
                    trouble.activity = time.monotonic()
                    await send.send(item)

        async with anyio.create_task_group() as group:
            group.start_soon(pump)
            try:
                yield receive, write
            finally:
                group.cancel_scope.cancel()


@asynccontextmanager
async def connect(endpoint: Endpoint, trouble: Trouble, *, connect_timeout_s: float,
                  max_bytes: int = MAX_CALL_BYTES) -> AsyncIterator[Client]:
    """A handshaken client session to ``endpoint``; typed errors when it cannot be had.

    ``max_bytes``: the largest answer (a JSON body, one event of a stream) taken from an HTTP server.
    """
    scratch: str | None = None
    stderr = None
    http = None

    def overflow(limit: int) -> None:
        trouble.too_large = limit

    async def on_message(message: Any) -> None:
        trouble.activity = time.monotonic()
        if isinstance(message, types.ToolListChangedNotification):
            trouble.list_changed = True

    try:
        if endpoint.url:
            http = guarded_client(max_bytes=max_bytes, allow_private=endpoint.allow_private, on_overflow=overflow)
            transport = streamable_http_client(endpoint.url, http_client=http, max_sse_event_size=max_bytes)
        else:
            scratch = LAUNCHER.scratch_dir(f"mcp-{endpoint.server}-")
            stderr = open(os.path.join(scratch, ".stderr"), "w+")  # noqa: SIM115 - closed in finally
            trouble.stderr_path = stderr.name
            exe, argv, env = LAUNCHER.command(endpoint.command, scratch=scratch, memory_mb=endpoint.memory_mb,
                                              cpu_s=endpoint.cpu_s, network=endpoint.network,
                                              max_line_bytes=max_bytes, env=endpoint.env, read_paths=endpoint.read_paths)
            params = StdioServerParameters(command=exe, args=argv, cwd=scratch, env=env)
            transport = stdio_client(params, errlog=stderr)
        client = Client(_watched(transport, trouble), mode="legacy", cache=None, message_handler=on_message)
        connected = anyio.Event()
        failure: BaseException | None = None
        async with anyio.create_task_group() as group:

            async def handshake_deadline() -> None:
                with anyio.move_on_after(connect_timeout_s):
                    await connected.wait()
                    return
                group.cancel_scope.cancel()

            group.start_soon(handshake_deadline)
            try:
                async with client:
                    connected.set()
                    yield client
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:  # noqa: BLE001 - sorted out below
                if connected.is_set():
                    raise
                failure = exc
            group.cancel_scope.cancel()
        if not connected.is_set():
            raise _unavailable(endpoint, failure or TimeoutError(), trouble)
    finally:
        if http is not None:
            with anyio.CancelScope(shield=True):
                await http.aclose()
        if stderr is not None:
            trouble.stderr_kept = trouble.stderr_tail()  # errors are named after the scratch directory is gone
            stderr.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _unavailable(endpoint: Endpoint, exc: BaseException, trouble: Trouble, tool: str | None = None) -> SandboxError:
    refused = _leaf(exc)
    if isinstance(refused, UrlRefusedError):
        return McpUrlNotAllowedError(f"MCP server {endpoint.server!r}: {refused} (TOOLRAIL_MCP_ALLOW_PRIVATE_URLS)",
                                     server=endpoint.server, tool=tool, **refused.details)
    if trouble.limit_hit() is not None:
        return _too_large(endpoint, trouble.limit_hit(), tool=tool)
    if trouble.protocol is not None:
        return McpProtocolError(f"MCP server {endpoint.server!r} sent {_short(trouble.protocol)}{trouble.ended()}",
                                server=endpoint.server, tool=tool,
                                **_exit(trouble))
    if endpoint.url:
        reason = _short(exc) if not isinstance(exc, TimeoutError) else "no answer to the handshake in time"
        # the URL's origin only: its path or query may carry a token, and this message reaches job records and logs
        return McpUnavailableError(f"MCP server {endpoint.server!r} ({_origin(endpoint.url)}) is unavailable: {reason}",
                                   server=endpoint.server, tool=tool)
    # a stdio server: what failed (it exited, or timed out), never what it printed (its stdout or stderr)
    reason = "no answer to the handshake in time" if isinstance(exc, TimeoutError) or trouble.exit_code() is None \
        else "it did not complete the handshake"
    return McpUnavailableError(f"MCP server {endpoint.server!r} (stdio) is unavailable: {reason}{trouble.ended()}",
                               server=endpoint.server, tool=tool, **_exit(trouble))


def _exit(trouble: Trouble) -> dict[str, Any]:
    code = trouble.exit_code()
    return {} if code is None else {"exit_code": code}


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def _too_large(endpoint: Endpoint, limit: int, *, tool: str | None, **names: Any) -> McpTooLargeError:
    what = f"its answer to a call of {tool!r}" if tool else "its answer"
    return McpTooLargeError(f"MCP server {endpoint.server!r}: {what} exceeds {limit} bytes; the rest was not read",
                            server=endpoint.server, tool=tool, limit_bytes=limit, **names)


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups that is not a cancellation."""
    while isinstance(getattr(exc, "exceptions", None), (list, tuple)) and exc.exceptions:  # an exception group
        inner = [e for e in exc.exceptions if not isinstance(e, anyio.get_cancelled_exc_class())]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _short(exc: BaseException) -> str:
    """What went wrong, never what a server sent: a line it could not parse is said to be one, by its size only."""
    exc = _leaf(exc)
    errors = getattr(exc, "errors", None)
    if callable(errors):  # a line the SDK could not parse (pydantic's report quotes it: it is not shown)
        try:
            bad = errors()[0].get("input")
        except Exception:  # noqa: BLE001
            bad = None
        size = f" of {len(bad.encode(errors='replace'))} bytes" if isinstance(bad, str) else ""
        return f"a line{size} that is not JSON-RPC"
    if isinstance(exc, ValueError) and type(exc).__name__ in {"JSONDecodeError", "ValidationError"}:
        return "a line that is not JSON-RPC"
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return f"{type(exc).__name__}: {text[:300]}"


async def list_tools(endpoint: Endpoint, *, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Every tool the server lists (all pages), as wire-shaped dicts (``inputSchema``, ``outputSchema``...)."""
    trouble = Trouble()
    tools: list[dict[str, Any]] = []
    try:
        async with connect(endpoint, trouble, connect_timeout_s=timeout_s, max_bytes=MAX_LISTING_BYTES) as client:
            with anyio.fail_after(timeout_s):
                cursor = None
                for _ in range(50):
                    page = await client.session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
                    tools.extend(t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
    except BaseException as caught:  # noqa: BLE001
        exc = _leaf(caught)
        if isinstance(exc, SandboxError):
            raise exc from None
        raise _unavailable(endpoint, exc, trouble) from None
    return tools


ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


async def invoke(client: Client, trouble: Trouble, endpoint: Endpoint, remote: str, arguments: dict[str, Any], *,
                 names: dict[str, str], timeout_s: float, idle_timeout_s: float, meta: dict[str, Any] | None,
                 on_progress: ProgressFn | None, started: float) -> types.CallToolResult:
    """One ``tools/call`` on an open session, under the idle and hard limits; typed errors."""
    result: types.CallToolResult | None = None
    limit: str | None = None
    trouble.activity = time.monotonic()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        trouble.activity = time.monotonic()
        if on_progress is not None:
            await on_progress(value, total, message)

    try:
        async with anyio.create_task_group() as group:

            async def watchdog() -> None:
                nonlocal limit
                while True:
                    now = time.monotonic()
                    if now - started >= timeout_s:
                        limit = "hard"
                    elif now - trouble.activity >= idle_timeout_s:
                        limit = "idle"
                    if limit:
                        group.cancel_scope.cancel()
                        return
                    await anyio.sleep(min(0.05, idle_timeout_s / 4))

            async def call() -> None:
                nonlocal result
                request = types.CallToolRequest(params=types.CallToolRequestParams(
                    name=remote, arguments=arguments, _meta=meta or None))
                result = await client.session.send_request(request, types.CallToolResult, progress_callback=progress)
                group.cancel_scope.cancel()

            group.start_soon(watchdog)
            group.start_soon(call)
    except BaseException as caught:  # noqa: BLE001 - mapped to the typed errors below
        raise call_error(caught, trouble, endpoint, remote, names) from None
    if result is None:
        if trouble.limit_hit() is not None:
            raise _too_large(endpoint, trouble.limit_hit(), tool=remote, tool_name=names["tool_name"])
        if trouble.protocol is not None:
            raise McpProtocolError(f"MCP server {endpoint.server!r}, tool {remote!r}: the server sent {_short(trouble.protocol)}",
                                   **names, **_exit(trouble))
        if limit == "hard":
            raise McpTimeoutError(f"{names['tool_name']} (MCP server {endpoint.server!r}) did not answer within its "
                                  f"{timeout_s:g} s cap", **names, limit="hard", timeout_s=timeout_s)
        if limit == "idle":
            raise McpTimeoutError(f"{names['tool_name']} (MCP server {endpoint.server!r}) reported no progress for "
                                  f"{idle_timeout_s:g} s", **names, limit="idle", timeout_s=idle_timeout_s)
        raise McpServerExitedError(f"MCP server {endpoint.server!r} ended the call of {remote!r} without a result"
                                   f"{trouble.ended()}",
                                   **names, **_exit(trouble))
    return result


def call_error(caught: BaseException, trouble: Trouble, endpoint: Endpoint, remote: str,
               names: dict[str, str]) -> BaseException:
    """The typed error that ``caught`` (raised under a call's session) stands for."""
    exc = _leaf(caught)
    if isinstance(exc, SandboxError):
        exc.details.update(names)
        return exc
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return exc
    if isinstance(exc, UrlRefusedError) or trouble.limit_hit() is not None:
        error = _unavailable(endpoint, exc, trouble, tool=remote)
        error.details.update(names)
        return error
    if trouble.protocol is not None:
        return McpProtocolError(f"MCP server {endpoint.server!r}, tool {remote!r}: the server sent {_short(trouble.protocol)}",
                                **names, **_exit(trouble))
    if isinstance(exc, MCPError) and "closed" in str(exc).lower():
        return McpServerExitedError(f"MCP server {endpoint.server!r} exited or hung up during a call of {remote!r}"
                                    f"{trouble.ended()}",
                                    **names, **_exit(trouble))
    if isinstance(exc, MCPError):
        return McpProtocolError(f"MCP server {endpoint.server!r}, tool {remote!r}: protocol error {exc.code}: "
                                f"{_short(exc)}", **names, code=exc.code)
    return McpProtocolError(f"MCP server {endpoint.server!r}, tool {remote!r}: {_short(exc)}", **names)


async def call_tool(endpoint: Endpoint, remote: str, arguments: dict[str, Any], *, tool_name: str,
                    timeout_s: float, idle_timeout_s: float, meta: dict[str, Any] | None = None,
                    output_schema: dict[str, Any] | None = None, on_progress: ProgressFn | None = None,
                    connect_timeout_s: float = 10.0) -> tuple[dict[str, Any], bool]:
    """Call ``remote`` on a connection of its own; returns (the checked result as JSON, whether the tool list changed)."""
    trouble = Trouble()
    started = time.monotonic()
    names = {"server": endpoint.server, "tool": remote, "tool_name": tool_name}
    try:
        async with connect(endpoint, trouble, connect_timeout_s=min(connect_timeout_s, timeout_s)) as client:
            result = await invoke(client, trouble, endpoint, remote, arguments, names=names, timeout_s=timeout_s,
                                  idle_timeout_s=idle_timeout_s, meta=meta, on_progress=on_progress, started=started)
    except BaseException as caught:  # noqa: BLE001
        raise call_error(caught, trouble, endpoint, remote, names) from None
    return checked_result(result, names=names, output_schema=output_schema), trouble.list_changed


def _text(result: types.CallToolResult) -> str:
    parts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(parts)[:4000]


def checked_result(result: types.CallToolResult, *, names: dict[str, str],
                   output_schema: dict[str, Any] | None) -> dict[str, Any] | str:
    """The result as JSON for the job record (a plain-text answer as its text), or the typed error it stands for."""
    if result.is_error:
        message = _text(result) or "the tool reported an error"
        raise ToolRaisedError(f"{names['tool_name']} (MCP server {names['server']!r}) answered with an error: "
                              f"{message[:300]}", **names,
                              tool_error={"type": "mcp_tool_error", "message": message,
                                          "structured": result.structured_content})
    if output_schema is not None:
        if result.structured_content is None:
            raise McpOutputError(f"{names['tool_name']} (MCP server {names['server']!r}) declares an outputSchema but "
                                 "returned no structuredContent", **names, errors=["structuredContent missing"])
        errors = validation_errors(output_schema, result.structured_content)
        if errors:
            raise McpOutputError(f"{names['tool_name']} (MCP server {names['server']!r}) returned a result that does "
                                 f"not match its outputSchema: {errors[0]}", **names, errors=errors[:10])
    if result.structured_content is not None:
        value = result.structured_content if isinstance(result.structured_content, dict) else \
            {"result": result.structured_content}
        size = len(json.dumps(value, ensure_ascii=False, default=str).encode())
        if size > MAX_RESULT_BYTES:  # the sandbox's cap on a local tool's result
            raise McpTooLargeError(f"{names['tool_name']} (MCP server {names['server']!r}) returned a result of {size} "
                                   f"bytes, over {MAX_RESULT_BYTES}", **names, limit_bytes=MAX_RESULT_BYTES, size=size)
        return value
    text = "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise McpTooLargeError(f"{names['tool_name']} (MCP server {names['server']!r}) returned text of "
                               f"{len(text.encode())} bytes, over {MAX_RESULT_BYTES}", **names,
                               limit_bytes=MAX_RESULT_BYTES, size=len(text.encode()))
    try:
        value = json.loads(text)
    except ValueError:
        return text  # plain text stays text: the tool message's content, MCP's text content
    return value if isinstance(value, dict) else {"result": value}
