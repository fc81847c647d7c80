"""Open MCP sessions kept per worker process, so a call does not pay for a connection (or a stdio start).

One event loop runs in a daemon thread of the worker process (started on first use, after Celery's
fork); each (tenant, server, endpoint) has at most one open session, held by a task of its own
that entered it (the SDK's cancel scopes must be left by the task that entered them). A Celery
worker process runs one call at a time, so a session serves one call at a time.

A session is dropped — its connection closed, its stdio server stopped — after any failed call
(timeout, protocol error, exit: the next call starts clean), when its connection dies, when it
has been idle ``MAX_IDLE_S`` or open ``MAX_AGE_S`` (which also bounds a stdio server's CPU-seconds
limit). A stdio server's scratch directory lives as long as its session.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from mcpbridge.session import Endpoint, Trouble, connect
from toolrail.logging import get_logger

__all__ = ["MAX_AGE_S", "MAX_IDLE_S", "SessionPool", "pool"]

log = get_logger("toolrail.mcp.pool")

MAX_IDLE_S = 120.0
MAX_AGE_S = 600.0
T = TypeVar("T")


@dataclass
class _Held:
    client: Any
    trouble: Trouble
    stop: anyio.Event
    opened: float = field(default_factory=time.monotonic)
    used: float = field(default_factory=time.monotonic)
    dead: bool = False
    task: asyncio.Task | None = None


class SessionPool:
    """Sessions by key, on a loop thread of this process."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None
        self._sessions: dict[tuple, _Held] = {}
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # first use, or a forked child's copy
                self._loop, self._pid, self._sessions = asyncio.new_event_loop(), os.getpid(), {}
                threading.Thread(target=self._loop.run_forever, name="toolrail-mcp-pool", daemon=True).start()
            return self._loop

    def run(self, key: tuple, endpoint: Endpoint, invoke: Callable[[Any, Trouble], Awaitable[T]], *,
            connect_timeout_s: float, deadline_s: float) -> T:
        """``invoke(client, trouble)`` on the session of ``key`` (opened if needed); blocks the calling thread."""
        return self.wait(self._use(key, endpoint, invoke, connect_timeout_s),
                         timeout_s=deadline_s + connect_timeout_s + 30)

    def wait(self, coroutine: Awaitable[T], *, timeout_s: float) -> T:
        """Run ``coroutine`` on the pool's loop; blocks the calling thread (a worker's) for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop()).result(timeout=timeout_s)

    async def _use(self, key: tuple, endpoint: Endpoint, invoke: Callable[[Any, Trouble], Awaitable[T]],
                   connect_timeout_s: float) -> T:
        await self._sweep()
        held = self._sessions.get(key)
        if held is None or held.dead:
            held = self._sessions[key] = await self._open(endpoint, connect_timeout_s)
        held.trouble.list_changed = False
        try:
            result = await invoke(held.client, held.trouble)
        except BaseException:
            await self._close(key)  # a failed call leaves nothing behind: the next one starts clean
            raise
        held.used = time.monotonic()
        return result

    async def _open(self, endpoint: Endpoint, connect_timeout_s: float) -> _Held:
        ready: asyncio.Future[_Held] = asyncio.get_running_loop().create_future()

        async def holder() -> None:
            trouble = Trouble()
            held: _Held | None = None
            try:
                async with connect(endpoint, trouble, connect_timeout_s=connect_timeout_s) as client:
                    held = _Held(client=client, trouble=trouble, stop=anyio.Event())
                    ready.set_result(held)
                    await held.stop.wait()
            except BaseException as exc:  # noqa: BLE001 - the opener gets it; a later death marks the session
                if not ready.done():
                    ready.set_exception(exc)
            finally:
                if held is not None:
                    held.dead = True

        task = asyncio.ensure_future(holder())
        held = await ready
        held.task = task
        return held

    async def _close(self, key: tuple) -> None:
        held = self._sessions.pop(key, None)
        if held is None:
            return
        held.stop.set()
        if held.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(held.task), timeout=10)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing what already failed
                held.task.cancel()

    async def _sweep(self) -> None:
        now = time.monotonic()
        for key, held in list(self._sessions.items()):
            if held.dead or now - held.used > MAX_IDLE_S or now - held.opened > MAX_AGE_S:
                await self._close(key)


#: The worker process's pool.
pool = SessionPool()
