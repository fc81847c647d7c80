"""Limits before parsing, before auth, with memory flat (issue 35, item 2) — against ``toolrail serve --no-worker`` in a
process of its own (the session's ``api_process``: its RSS is what is measured), API keys on, requests sent without a
key over raw sockets.

- ``Content-Length: 0`` beside ``Transfer-Encoding: chunked`` (request smuggling's framing, RFC 9112 §6.3): 400
  ``conflicting_framing`` and the connection closed. Before: the guard took it as bodiless, h11 read the 100 MB
  chunked body anyway, FastAPI parsed it and the API grew from 112 to 399 MB and answered 422.
- a chunked body with no length: counted as it streams, 413 at the limit, the connection closed, the rest unread.
- the same body through that framing, 3 MB (was 422 ``validation_error``) or nested 50,000 deep (was a generic 400).
"""

from __future__ import annotations

import socket
import time

import pytest


HEAD = (b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
MB = 1_000_000


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _chunked(port: int, headers: bytes, *, prefix: bytes, total: int, fill: bytes = b"x") -> tuple[bytes, int, bool]:
    """Stream a chunked body of ``total`` bytes (``prefix`` then ``fill``) until the server answers; returns (the
    response as read until the server closed, bytes sent, whether the server closed the connection)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    sent = 0
    try:
        sock.sendall(HEAD + headers + b"Transfer-Encoding: chunked\r\n\r\n")
        if prefix:  # an empty chunk would end the body
            sock.sendall(b"%x\r\n%s\r\n" % (len(prefix), prefix))
            sent += len(prefix)
        piece = fill * 256 * 1024
        sock.setblocking(False)
        while sent < total:
            frame = b"%x\r\n%s\r\n" % (len(piece), piece)
            view = memoryview(frame)
            while view:
                try:
                    view = view[sock.send(view):]
                except BlockingIOError:
                    time.sleep(0.001)
                    if _answered(sock):
                        raise ConnectionAbortedError from None
            sent += len(piece)
        sock.setblocking(True)
        sock.sendall(b"0\r\n\r\n")
    except (ConnectionAbortedError, BrokenPipeError, ConnectionResetError):
        pass
    sock.setblocking(True)
    reply, closed = b"", False
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                closed = True
                break
            reply += data
            if _whole_answer_kept_open(reply):
                break  # nothing more comes on that connection until its idle timeout (5 s)
    except (ConnectionResetError, TimeoutError):
        closed = True  # reset: the server closed with our unread bytes in its buffer
    sock.close()
    return reply, sent, closed


def _whole_answer_kept_open(reply: bytes) -> bool:
    """``reply`` holds a whole answer (its headers and Content-Length bytes of body) that does not close the connection."""
    head, sep, body = reply.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.lower().split(b"\r\n")[1:] if b":" in line)
    return bool(sep) and fields.get(b"connection", b"").strip() != b"close" and \
        len(body) >= int(fields.get(b"content-length", b"0"))


def _answered(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    except OSError:
        return True


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def test_content_length_beside_chunked_is_refused_and_the_body_never_read(api_process: tuple[int, int]) -> None:
    port, pid = api_process
    before = _rss_mb(pid)
    reply, sent, closed = _chunked(port, b"Content-Length: 0\r\n", prefix=b'{"raw_output": "', total=100 * MB)
    grown = _rss_mb(pid) - before
    assert _status(reply) == 400, reply[:300]
    assert b'"conflicting_framing"' in reply and b"connection: close" in reply.lower()
    assert closed, "the connection must be closed: the body after the headers is not a next request"
    assert sent < 100 * MB, f"the server read the whole {sent} bytes"
    assert grown < 20, f"the API grew {grown:.0f} MB on a refused request"


def test_a_chunked_body_is_counted_as_it_streams_and_refused_at_the_limit(api_process: tuple[int, int]) -> None:
    port, pid = api_process
    before = _rss_mb(pid)
    reply, sent, closed = _chunked(port, b"", prefix=b'{"raw_output": "', total=100 * MB)
    grown = _rss_mb(pid) - before
    assert _status(reply) == 413 and b'"body_too_large"' in reply, reply[:300]
    assert closed and sent < 20 * MB, f"{sent} bytes were taken before the refusal"
    assert grown < 20, f"the API grew {grown:.0f} MB on a refused request"


@pytest.mark.parametrize(("length", "prefix", "fill", "total", "status", "kind"), [
    (None, b'{"raw_output": "', b"x", 3 * MB, 413, b"body_too_large"),  # was 422 validation_error
    (b"0", b'{"raw_output": "', b"x", 3 * MB, 400, b"conflicting_framing"),  # was 422 validation_error
    (None, b"", b"[", 50_000, 400, b"too_deep"),
    (b"0", b"", b"[", 50_000, 400, b"conflicting_framing"),  # was a generic 400
])
def test_bodies_of_either_framing_get_their_typed_error_before_auth(api_process: tuple[int, int], length: bytes | None,
                                                                   prefix: bytes, fill: bytes, total: int, status: int,
                                                                   kind: bytes) -> None:
    port, _ = api_process
    headers = b"" if length is None else b"Content-Length: " + length + b"\r\n"
    reply, _, _ = _chunked(port, headers, prefix=prefix, total=total, fill=fill)
    assert _status(reply) == status and b'"' + kind + b'"' in reply, reply[:300]
