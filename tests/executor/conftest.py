"""Executor fixtures: real Redis (the session's), real Celery workers, the real API.

The worker pool is started once per session as a child process running
``celery -A executor.worker.celery worker`` on every queue, with the test-only tools loaded,
no decider (spine tests bring their own tool calls), and the ledger on the session Redis.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from executor.stack import start_worker, stop_process, wait_for_workers
from tools.ledger import Ledger

TEST_TOOL_MODULES = "tests.executor.tools_for_tests"
LEDGER_PREFIX = "test:ledger"
SECRET = "s3cr3t-worker-only"
#: Signing secret of the test session's webhooks (default tenant).
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


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
            "TOOLRAIL_WEBHOOK_TIMEOUT_S": "2", "TOOLRAIL_WEBHOOK_SECRET": WEBHOOK_SECRET}


@pytest.fixture(scope="session", autouse=True)
def _executor_env(worker_env: dict[str, str]) -> Iterator[None]:
    """The pytest process sees the same tools and settings as the workers."""
    from toolrail.settings import get_settings
    from tools.registry import default_registry

    saved = {k: os.environ.get(k) for k in worker_env}
    os.environ.update({k: v for k, v in worker_env.items() if k != "TOOLRAIL_TEST_SECRET"})
    default_registry.cache_clear()
    get_settings.cache_clear()
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    default_registry.cache_clear()
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def worker_log() -> Path:
    return Path(tempfile.mkdtemp(prefix="toolrail-worker-log-")) / "worker.log"


@pytest.fixture(scope="session")
def worker(redis_url: str, worker_env: dict[str, str], worker_log: Path) -> Iterator[object]:
    """A real Celery worker pool (2 processes) on every queue of the deployment (``deployment_queues``, as serve's)."""
    proc = start_worker(redis_url, concurrency=2, env=worker_env, log_file=worker_log, hostname="toolrail-test@%h")
    try:
        wait_for_workers(redis_url, count=1, timeout_s=60)
        yield proc
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def runtime(redis_url: str):
    from executor.runs.runtime import Runtime
    from toolrail.settings import get_settings

    return Runtime.from_settings(get_settings(), redis_url=redis_url)


@pytest.fixture(scope="session")
def api(runtime, worker) -> Iterator[str]:
    """The API on a loopback port, over the session Redis and workers."""
    from executor.api.app import create_app
    from executor.stack import serve_in_thread
    from toolrail.settings import get_settings

    server, thread, base = serve_in_thread(create_app(get_settings(), runtime, mount_openai=False))
    yield base
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture()
def client(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def ledger(redis_client: redis.Redis) -> Ledger:
    book = Ledger(redis_client, prefix=LEDGER_PREFIX)
    book.seed()
    return book


def wait_terminal(client: httpx.Client, job_id: str, timeout_s: float = 60.0) -> dict:
    """Poll a job until it reaches a terminal status."""
    from executor.stack import wait_for_job
    from executor.store.records import TERMINAL_JOB

    job = wait_for_job(client, job_id, timeout_s=timeout_s)
    assert job["status"] in TERMINAL_JOB, f"job {job_id} not terminal after {timeout_s}s: {job}"
    return job


# ----------------------------------------------------------------- a stack of a module's own


def own_database(number: int) -> str:
    """A database of the session's Redis for one module (emptied): its broker and its job records, so its
    workers never take another module's messages."""
    url = f"{os.environ['REDIS_URL'].rsplit('/', 1)[0]}/{number}"
    redis.Redis.from_url(url).flushdb()
    return url


def start_decider_worker(db_url: str, *, factory: str, env: dict[str, str] | None = None, queues: tuple[str, ...] = (),
                         name: str) -> tuple[object, Path]:
    """A real worker pool on ``db_url`` with the test tools and ``TOOLRAIL_DECIDER=custom`` from ``factory``; returns
    the process (stop it with ``stop_process``) and its log file (every queue of the deployment, and ``queues``)."""
    from executor.stack import deployment_queues

    worker_env = {"TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": factory,
                  "TOOLRAIL_TOOL_MODULES": TEST_TOOL_MODULES, "TOOLRAIL_LOG_JSON": "1", **(env or {})}
    log = Path(tempfile.mkdtemp(prefix=f"toolrail-{name}-")) / "worker.log"
    proc = start_worker(db_url, queues=deployment_queues(db_url, extra=queues), concurrency=2, env=worker_env,
                        log_file=log, hostname=f"toolrail-{name}@%h")
    wait_for_workers(db_url, count=1, timeout_s=90)
    return proc, log


def publishers(db_url: str):  # noqa: ANN201 - (enqueue, rerun) as create_app takes them
    """``enqueue(job)`` and ``rerun(job, call)`` publishing on ``db_url``'s broker (the API's Celery app is bound to the
    session's), for ``create_app(enqueue=..., rerun=...)``."""
    from celery import Celery

    app = Celery(f"publisher-{db_url.rsplit('/', 1)[1]}", broker=db_url)

    def enqueue(job) -> None:  # noqa: ANN001
        app.send_task("toolrail.decide", args=[job.job_id], queue="decide")

    def rerun(job, call) -> None:  # noqa: ANN001
        app.send_task("toolrail.run_call", args=[job.job_id, call.id], queue=call.queue)

    return enqueue, rerun


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (None once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def pool_process_of(pid: int) -> int:
    """The Celery pool process above ``pid`` (a tool process, a sandbox's monitor, a deciding process)."""
    for _ in range(6):
        if b"celery" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
        parent = parent_pid(pid)
        assert parent is not None, f"process {pid} is gone"
        pid = parent
    raise AssertionError("no Celery pool process above the given pid")
