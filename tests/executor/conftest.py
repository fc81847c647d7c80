"""The executor's tests run with the workers' tools and settings (the session's stack: ``tests.harness``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _executor_env(executor_env: None) -> Iterator[None]:
    yield
