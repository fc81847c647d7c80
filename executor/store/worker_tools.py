"""The tools the workers serve, as each worker pool published them at its start.

    tr:workers:tools    hash: worker node name → {"demo_tools", "modules", "tools", "at"}

A process with an environment of its own — ``toolrail mcp stdio``, started by an MCP host with little more than
``REDIS_URL`` — builds its registry from what the workers load (their demo tools and tool modules), not from its
own ``TOOLRAIL_*`` variables, and can tell which of the workers' tools it cannot load. An entry older than
:data:`MAX_AGE_S` (a worker gone for a week) is not read.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["KEY", "MAX_AGE_S", "WorkerTools", "publish", "published"]

KEY = "tr:workers:tools"
MAX_AGE_S = 7 * 24 * 3600


@dataclass(frozen=True)
class WorkerTools:
    """One worker pool's tool sources and the tools they gave it."""

    worker: str
    demo_tools: tuple[str, ...]
    modules: tuple[str, ...]
    tools: tuple[str, ...]
    at: float


def publish(client: redis.Redis, worker: str, *, demo_tools: list[str] | tuple[str, ...],
            modules: list[str] | tuple[str, ...], tools: list[str]) -> None:
    """Record what ``worker`` loaded (called once per worker start, after its tools passed their check)."""
    client.hset(KEY, worker, json.dumps({"demo_tools": list(demo_tools), "modules": list(modules),
                                         "tools": sorted(tools), "at": time.time()}))


def published(client: redis.Redis, *, now: float | None = None) -> list[WorkerTools]:
    """Every worker's record younger than :data:`MAX_AGE_S`, newest first."""
    now = time.time() if now is None else now
    found = []
    for worker, raw in client.hgetall(KEY).items():
        try:
            data: dict[str, Any] = json.loads(raw)
            entry = WorkerTools(worker=worker.decode() if isinstance(worker, bytes) else str(worker),
                                demo_tools=tuple(data.get("demo_tools") or ()), modules=tuple(data.get("modules") or ()),
                                tools=tuple(data.get("tools") or ()), at=float(data.get("at") or 0))
        except (ValueError, TypeError, AttributeError):
            continue
        if now - entry.at <= MAX_AGE_S:
            found.append(entry)
    return sorted(found, key=lambda e: -e.at)
