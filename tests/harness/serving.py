"""What a test serves: an ASGI app on loopback (``api_server``) and a real worker pool (``worker_pool``), each
stopped when its block ends, however it ends."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from executor.stack import start_worker, stop_process, wait_for_workers

__all__ = ["api_server", "worker_pool"]


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


@contextlib.contextmanager
def worker_pool(redis_url: str, *, timeout_s: float = 90.0, **options: Any) -> Iterator[object]:
    """A real Celery worker pool on ``redis_url`` (``executor.stack.start_worker``'s ``options``) once a worker
    answers; the process while the block runs, stopped when it ends."""
    proc = start_worker(redis_url, **options)
    try:
        wait_for_workers(redis_url, count=1, timeout_s=timeout_s)
        yield proc
    finally:
        stop_process(proc)
