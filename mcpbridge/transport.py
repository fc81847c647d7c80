"""The HTTP transport under every streamable-HTTP MCP connection: the SSRF guard at each request, bounded bodies.

The SDK's client (``mcp.client.streamable_http``) takes an ``httpx2.AsyncClient``; toolrail gives it
one whose transport is a :class:`GuardedTransport`:

- **resolve and pin at every request** — the URL's host is resolved and checked by
  :mod:`toolrail.netguard` (global addresses only unless the operator allows private ones), and the
  request goes to the checked address (``Host`` and the TLS server name keep the URL's host). A name
  that turns into 127.0.0.1 after registration is refused at the refresh or call that would follow it;
  no proxy from the environment is used (it would connect elsewhere).
- **bounded bodies** — a response is streamed through a counter and cut at ``max_bytes``: a JSON body
  in all, an event stream per event (a blank line ends one). The SDK never holds more than that of an
  answer, whatever the server sends; ``on_overflow(limit)`` is told, so the caller can name the cause.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
import httpx2

from toolrail import netguard

__all__ = ["GuardedTransport", "ResponseTooLargeError", "guarded_client"]

#: The SDK's own timeouts for its HTTP client (``mcp.shared._httpx_utils``): 30 s, 300 s to read a stream.
_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
_EVENT_END = (b"\n\n", b"\r\n\r\n", b"\r\r")


class ResponseTooLargeError(httpx2.StreamError):
    """A response body (or one event of a stream) longer than the limit; the SDK turns it into a failed request."""


class _Bounded(httpx2.AsyncByteStream):
    """The body of ``response``, raising :class:`ResponseTooLargeError` past ``limit`` bytes (per event if ``events``)."""

    def __init__(self, inner: httpx2.AsyncByteStream, *, limit: int, events: bool,
                 on_overflow: Callable[[int], None] | None) -> None:
        self._inner, self._limit, self._events, self._on_overflow = inner, limit, events, on_overflow

    async def __aiter__(self) -> AsyncIterator[bytes]:
        count, tail = 0, b""  # bytes of the body (or of the event being read) so far; the last bytes seen
        # an event that starts and ends inside one chunk is under the limit: httpcore reads at most 64 KiB at a time
        async for chunk in self._inner:
            if self._events:
                window = tail + chunk
                ends = [window.rfind(end) + len(end) for end in _EVENT_END if window.rfind(end) >= 0]
                count = len(window) - max(ends) if ends else count + len(chunk)
                tail = window[-3:]
            else:
                count += len(chunk)
            if count > self._limit:
                if self._on_overflow is not None:
                    self._on_overflow(self._limit)
                raise ResponseTooLargeError(f"the MCP server's answer exceeds {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class GuardedTransport(httpx2.AsyncBaseTransport):
    """``httpx2``'s transport behind the SSRF guard and the body limit (module docstring)."""

    def __init__(self, *, max_bytes: int, allow_private: bool, on_overflow: Callable[[int], None] | None = None,
                 inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.max_bytes, self.allow_private, self._on_overflow = max_bytes, allow_private, on_overflow
        self._inner = inner or httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        host = url.raw_host.decode("ascii")
        # netguard.resolve_host is looked up per request so that a test's double applies to live connections too
        addresses = await anyio.to_thread.run_sync(
            lambda: netguard.check_host(host, port, allow_private=self.allow_private, resolve=netguard.resolve_host))
        request.url, host_header, extensions = netguard.pinned(url, addresses[0])
        request.headers["Host"] = host_header["Host"]
        request.extensions = {**request.extensions, **extensions}
        response = await self._inner.handle_async_request(request)
        events = response.headers.get("content-type", "").lower().startswith("text/event-stream")
        return httpx2.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                               stream=_Bounded(response.stream, limit=self.max_bytes, events=events,
                                               on_overflow=self._on_overflow), request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def guarded_client(*, max_bytes: int, allow_private: bool,
                   on_overflow: Callable[[int], None] | None = None) -> httpx2.AsyncClient:
    """An ``httpx2.AsyncClient`` for the SDK's streamable-HTTP client: guarded, bounded, no proxies, no redirects."""
    return httpx2.AsyncClient(transport=GuardedTransport(max_bytes=max_bytes, allow_private=allow_private,
                                                         on_overflow=on_overflow), timeout=_TIMEOUT, trust_env=False)
