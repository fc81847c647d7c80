"""An ASGI app served on loopback for a test: the one API-in-a-thread block."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

__all__ = ["api_server"]


@contextlib.contextmanager
def api_server(app: object, *, timeout_s: float = 30.0) -> Iterator[str]:
    """``app`` (any ASGI app: the job API, the decider's, an MCP server's) under uvicorn on a free loopback port,
    in a thread: its base URL once it has started; stopped (its thread joined) when the block ends, however it ends."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="toolrail-test-api", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not (server.started and server.servers):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the app did not start within {timeout_s} s")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
