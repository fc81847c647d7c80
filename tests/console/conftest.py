"""The console's browser tests: Debian's chromium (``/usr/bin/chromium``, installed by ``make install``) driven by
Playwright's sync API (a browser per module, a context per test), never a downloaded browser; a real stack of the module's own: a traced
Celery worker on its own Redis database, and two APIs over it (one without keys, one with two tenants' keys)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.harness.databases import own_database
from tests.harness.fixtures import LEDGER_PREFIX, workers_environment
from tests.harness.jobs import publishers
from tests.harness.serving import api_server, worker_pool

CHROMIUM = Path("/usr/bin/chromium")
KEYS = {"alpha": "key-console-alpha", "beta": "key-console-beta"}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium for one module's tests. Module-scoped on purpose: while Playwright's sync API is running it
    holds an event loop in the main thread, so a session-long browser made every later ``asyncio.run`` in the
    suite fail ("cannot be called from a running event loop")."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (`make install` runs it)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    """A fresh context (no storage shared between tests) and its page."""
    context = browser.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture(scope="module", autouse=True)
def _workers_environment(worker_env: dict[str, str]) -> Iterator[None]:
    """This process sees the workers' tools (the test tools: slow_echo) and settings while a console module runs,
    and only then: the directories after this one (decider/, e2e/) run with their own (a session-long setting here
    made ``toolrail generate`` in tests/decider find ``TOOLRAIL_DECIDER=none``). The stack below is per module
    too, so that it is built inside this environment (an autouse fixture comes first only within its scope)."""
    with workers_environment(worker_env):
        yield


@pytest.fixture(scope="module")
def console_db() -> str:
    return own_database("tests.console")


@pytest.fixture(scope="module")
def console_worker(console_db: str, worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Celery worker on the console tests' database, its spans (and its sandboxes') kept in Redis."""
    import redis

    from executor.worker.config import worker_queues
    from tools.ledger import Ledger
    from tools.registry import default_registry

    Ledger(redis.Redis.from_url(console_db), prefix=LEDGER_PREFIX).seed()
    log = tmp_path_factory.mktemp("console") / "worker.log"
    with worker_pool(console_db, queues=worker_queues(default_registry()), concurrency=2,
                     env={**worker_env, "TOOLRAIL_TRACE_STORE": "redis"}, log_file=log,
                     hostname="toolrail-console@%h") as proc:
        yield proc


def _app(console_db: str, **settings: Any) -> Any:
    """The job API over the console's store, its spans in the same store."""
    from executor.api.app import create_app
    from executor.runtime import Runtime
    from toolrail import tracing
    from toolrail.settings import Settings

    config = Settings(redis_url=console_db, trace_store="redis", rate_limit_per_s=0, **settings)
    runtime = Runtime.from_settings(config)
    tracing.setup("api", settings=config, redis_client=runtime.redis)  # the API's spans, in the same store
    enqueue, rerun = publishers(console_db)
    return create_app(config, runtime, enqueue=enqueue, rerun=rerun, ping_workers=lambda: 1, mount_openai=False)


@pytest.fixture(scope="module")
def console_api(console_db: str, console_worker: Any) -> Iterator[str]:
    """The API without keys (a local install), reconciling every half second (the workers view shows its sweep)."""
    with api_server(_app(console_db, reconcile_interval_s=0.5)) as base:
        yield base


@pytest.fixture(scope="module")
def keyed_api(console_db: str, console_worker: Any) -> Iterator[str]:
    """The API with two tenants' keys, over the same store and worker."""
    with api_server(_app(console_db, reconcile_interval_s=0,
                         api_keys=",".join(f"{key}:{tenant}" for tenant, key in KEYS.items()))) as base:
        yield base
