"""The session's stack as fixtures (a pytest plugin: ``tests/conftest.py`` loads it): real Redis (the session's),
real Celery workers, the real API — each built once, whichever test directory asks first.

The worker pool is started once per session as a child process running
``celery -A executor.worker.celery worker`` on every queue, with the test-only tools loaded,
no decider (spine tests bring their own tool calls), and the ledger on the session Redis.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from executor.stack import stop_process, wait_http_ok
from tests.harness.databases import own_database
from tests.harness.serving import api_server, worker_pool
from toolrail.redis_embed import free_port
from tools.ledger import Ledger

TEST_TOOL_MODULES = "tests.executor.tools_for_tests"
#: The folder of the SDK-written test MCP servers (tests/mcpbridge/mcp_servers.py).
MCP_TEST_SERVERS = str(Path(__file__).resolve().parents[1] / "mcpbridge")
LEDGER_PREFIX = "test:ledger"
SECRET = "s3cr3t-worker-only"
#: Signing secret of the test session's webhooks (default tenant).
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#: The tenants' API keys of the session's ``toolrail serve --no-worker`` (``api_process``), and its metrics key.
API_KEYS = "key-alpha-18:alpha,key-beta-18:beta"
METRICS_KEY = "metrics-key-18"


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


@pytest.fixture(scope="module")
def db_url(request: pytest.FixtureRequest) -> str:
    """A database of the session's Redis that only the requesting test module uses (its workers, its API)."""
    return own_database(request.module.__name__)


@pytest.fixture(scope="session")
def redis_client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture(scope="session")
def worker_env() -> dict[str, str]:
    marker_dir = tempfile.mkdtemp(prefix="toolrail-markers-")
    return {"TOOLRAIL_DECIDER": "none", "TOOLRAIL_TOOL_MODULES": TEST_TOOL_MODULES, "TOOLRAIL_LEDGER_PREFIX": LEDGER_PREFIX,
            "TOOLRAIL_TEST_SECRET": SECRET, "TOOLRAIL_TEST_MARKER_DIR": marker_dir, "TOOLRAIL_LOG_JSON": "1",
            # webhooks: the tests' receivers listen on loopback; short retries
            "TOOLRAIL_WEBHOOK_ALLOW_PRIVATE": "1", "TOOLRAIL_WEBHOOK_BACKOFF_S": "0.2", "TOOLRAIL_WEBHOOK_MAX_ATTEMPTS": "4",
            "TOOLRAIL_WEBHOOK_TIMEOUT_S": "2", "TOOLRAIL_WEBHOOK_SECRET": WEBHOOK_SECRET,
            # the test MCP servers' scripts, which a stdio registration names in read_paths
            "TOOLRAIL_MCP_STDIO_READ_ROOTS": MCP_TEST_SERVERS,
            # no API of the tests refreshes its MCP servers in the background (each test refreshes when it means to)
            "TOOLRAIL_MCP_REFRESH_INTERVAL_S": "0"}


@contextmanager
def workers_environment(worker_env: dict[str, str]) -> Iterator[None]:
    """This process sees the same tools and settings as the workers, and gets its own back afterwards."""
    with environment({k: v for k, v in worker_env.items() if k != "TOOLRAIL_TEST_SECRET"}):
        yield


@contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """This process's environment with ``values`` set (None: unset) and every cached setting read again, then its
    own back."""
    from mcpbridge.settings import mcp_settings
    from toolrail.settings import get_settings
    from tools.registry import default_registry

    def apply(wanted: dict[str, str | None]) -> None:
        for key, value in wanted.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for cached in (default_registry, get_settings, mcp_settings):  # read again from the environment as it is now
            cached.cache_clear()

    saved = {k: os.environ.get(k) for k in values}
    apply(values)
    try:
        yield
    finally:
        apply(saved)


def mcp_environment(**values: object) -> contextlib.AbstractContextManager[None]:
    """:func:`environment` with ``TOOLRAIL_MCP_<NAME>`` set from ``name=value`` (the MCP extension's settings, which
    the API reads when it mounts the bridge: build the app inside it)."""
    return environment({f"TOOLRAIL_MCP_{name.upper()}": None if value is None else
                        str(value).lower() if isinstance(value, bool) else str(value) for name, value in values.items()})


@pytest.fixture(scope="session")
def executor_env(worker_env: dict[str, str]) -> Iterator[None]:
    """The pytest process sees the same tools and settings as the workers (the executor's and MCP's test
    directories use it for all their tests: their conftests' autouse ``_executor_env``)."""
    with workers_environment(worker_env):
        yield


@pytest.fixture(scope="session")
def worker_log() -> Path:
    return Path(tempfile.mkdtemp(prefix="toolrail-worker-log-")) / "worker.log"


@pytest.fixture(scope="session")
def worker(redis_url: str, worker_env: dict[str, str], worker_log: Path) -> Iterator[object]:
    """A real Celery worker pool (2 processes) on every queue of the deployment (``deployment_queues``, as serve's)."""
    with worker_pool(redis_url, timeout_s=60, concurrency=2, env=worker_env, log_file=worker_log,
                     hostname="toolrail-test@%h") as proc:
        yield proc


@pytest.fixture(scope="session")
def runtime(redis_url: str):
    from executor.runtime import Runtime
    from executor.worker.tasks import QUEUES
    from toolrail.settings import get_settings

    return Runtime.from_settings(get_settings(), redis_url=redis_url, queues=QUEUES)


@pytest.fixture(scope="session")
def api(runtime, worker) -> Iterator[str]:
    """The API on a loopback port, over the session Redis and workers."""
    from executor.api.app import create_app
    from toolrail.settings import get_settings

    with api_server(create_app(get_settings(), runtime, mount_openai=False)) as base:
        yield base


@pytest.fixture()
def client(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def ledger(redis_client: redis.Redis) -> Ledger:
    book = Ledger(redis_client, prefix=LEDGER_PREFIX)
    book.seed()
    return book


@pytest.fixture(scope="session")
def api_process(redis_url: str) -> Iterator[tuple[int, int]]:
    """``toolrail serve --no-worker`` in a process of its own (its RSS can be measured): the API as shipped on
    127.0.0.1, on the session's Redis, ``API_KEYS`` on, no rate limit, no reconciler; (port, pid)."""
    port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "TOOLRAIL_API_KEYS": API_KEYS, "TOOLRAIL_METRICS_KEY": METRICS_KEY,
           "TOOLRAIL_SSE_HEARTBEAT_S": "5", "TOOLRAIL_SSE_MAX_STREAMS_PER_TENANT": "120",
           "TOOLRAIL_RATE_LIMIT_PER_S": "0", "TOOLRAIL_DECIDER": "none", "TOOLRAIL_RECONCILE_INTERVAL_S": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--no-worker", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base, timeout_s=60)
        yield port, proc.pid
    finally:
        stop_process(proc)
