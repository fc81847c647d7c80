"""A whole toolrail on one machine: Redis (embedded if needed), a Celery worker pool, the API.

Used by ``toolrail serve``, ``toolrail run`` and ``toolrail demo``, and by the test
session — the same real components everywhere.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from executor.api.app import create_app
from executor.api.context import JobDesk
from executor.api.readiness import mark_worker_down
from executor.ports import Jobs
from executor.runtime import Runtime
from executor.store.worker_tools import published
from executor.worker import liveness
from executor.worker.config import DECIDER_WARM_KEY, TOOL_CHECK_EXIT, celery_config, worker_queues
from toolrail.extensions import TOOL_SOURCES_GROUP, installed
from toolrail.lifeline import dies_with_parent
from toolrail.logging import get_logger
from toolrail.redis_embed import EmbeddedRedis, ensure_redis, free_port
from toolrail.redis_embed import redis_url as required_redis_url
from toolrail.settings import DEFAULT_CACHE_DIR, Settings, display_url, get_settings
from tools.registry import Registry, default_registry, load_registry

__all__ = ["LocalStack", "SupervisedWorker", "deployment_jobs", "deployment_queues", "serve_in_thread", "start_worker",
           "wait_for_workers", "wait_http_ok"]

log = get_logger("toolrail.stack")


def deployment_queues(redis_url: str | None = None, *, extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The queues of this deployment's worker (``executor.worker.config.worker_queues``): decide, webhooks, every tool
    queue, ``extra``, and the queues of every installed tool source's tools (a tenant's MCP servers) when ``redis_url``
    answers (else none: a worker still picks those up from the broadcast sent when a server is registered)."""
    sourced: list[str] = []
    if redis_url:
        try:
            client = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
            sourced = [queue for source in installed(TOOL_SOURCES_GROUP) for queue in source.queues(client)]
        except redis.RedisError:
            pass
    return worker_queues(default_registry(), extra=[*extra, *sourced])


def deployment_jobs(settings: Settings) -> Jobs:
    """The running deployment's jobs, for a process of its own beside it (``toolrail mcp stdio``): over its Redis
    (``REDIS_URL``, never a guessed default port: unset is one line, ``RedisNotConfiguredError``) and its Celery
    queues, with the tools its workers load (as they published them at start). A Redis that does not answer raises
    here, before anyone waits on it."""
    from executor.worker.tasks import QUEUES  # lazy: the Celery app reads REDIS_URL at import; the caller sets it first

    runtime = Runtime.from_settings(settings, redis_url=required_redis_url(settings), queues=QUEUES)
    runtime.redis.ping()
    runtime.registry = _workers_registry(runtime.redis)
    return JobDesk(runtime, QUEUES.decide, QUEUES.dispatch)


def _workers_registry(client: redis.Redis) -> Registry:
    """The registry the workers load (their demo tools and tool modules, as they published them at start), loaded
    here; a tool they serve that this process cannot load stops the command with one line naming it and why."""
    workers = published(client)
    if not workers:
        raise SystemExit("toolrail mcp stdio: no worker has published its tools on this Redis (each does at its "
                         "start): start the workers first (toolrail serve)")
    modules = list(dict.fromkeys(module for worker in workers for module in worker.modules))
    registry = load_registry(modules=modules, demo_tools={name for worker in workers for name in worker.demo_tools})
    served = {name: worker.worker for worker in reversed(workers) for name in worker.tools}
    missing = sorted(set(served) - set(registry.names()))
    if missing:
        why = "; ".join(problem.message() for problem in registry.problems) or \
            f"its modules ({', '.join(modules) or 'none'}) did not register them here"
        raise SystemExit(f"toolrail mcp stdio: the workers serve {', '.join(missing)} (worker "
                         f"{served[missing[0]]}), which this process cannot load: {why}. Run it in the workers' "
                         "Python environment")
    return registry


def start_worker(redis_url: str, *, queues: list[str] | None = None, concurrency: int = 2,
                 env: dict[str, str] | None = None, hostname: str | None = None,
                 log_file: Path | None = None) -> subprocess.Popen:
    """Start ``celery -A executor.worker.celery worker`` as a child process (``queues``: default, the deployment's)."""
    if queues is None:
        queues = deployment_queues(redis_url)
    child_env = {**os.environ, **(env or {}), "REDIS_URL": redis_url}
    root = str(Path(__file__).resolve().parent.parent)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, child_env.get("PYTHONPATH")]))
    args = [sys.executable, "-m", "celery", "-A", "executor.worker.celery", "worker", "-Q", ",".join(queues),
            "-c", str(concurrency), "--pool", "prefork", "-n", hostname or f"toolrail-{os.getpid()}-{free_port()}@%h",
            "--without-gossip", "--without-mingle", "--loglevel", "WARNING"]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    return subprocess.Popen(args, env=child_env, stdout=out, stderr=subprocess.STDOUT if log_file else None,
                            start_new_session=True, preexec_fn=dies_with_parent())  # dies with this thread, SIGKILLed too


def wait_for_workers(redis_url: str, *, count: int = 1, timeout_s: float = 60.0) -> int:
    """Block until ``count`` workers answer a ping."""
    from celery import Celery  # noqa: PLC0415

    probe = Celery("toolrail-probe", broker=redis_url)
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        try:
            seen = len(probe.control.ping(timeout=0.5, limit=count) or [])  # answers as soon as count replied
        except (redis.RedisError, OSError):
            seen = 0
        if seen >= count:
            return seen
        time.sleep(0.3)
    raise TimeoutError(f"{count} worker(s) did not answer within {timeout_s}s (saw {seen})")


def wait_http_ok(base_url: str, *, path: str = "/healthz", timeout_s: float = 30.0) -> None:
    """Block until ``GET base_url+path`` answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base_url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{base_url}{path} did not answer 200 within {timeout_s} s")


def serve_in_thread(app: object, *, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = 30.0) -> tuple[object, threading.Thread, str]:
    """Run an ASGI app under uvicorn in a daemon thread; returns (server, thread, base URL) once it answers."""
    import uvicorn  # noqa: PLC0415

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="toolrail-api", daemon=True)
    thread.start()
    base_url = f"http://{host}:{port}"
    wait_http_ok(base_url, timeout_s=timeout_s)
    return server, thread, base_url


def stop_process(proc: subprocess.Popen | None, *, grace_s: float = 10.0) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after ``grace_s`` (at once when ``grace_s`` is 0: a pool killed
    mid-task says nothing, where one told to stop reports each busy pool process it loses)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


class SupervisedWorker:
    """A worker pool started again, with backoff and a log line, whenever its Celery main process dies (``toolrail
    serve``'s pool).

    While it is down ``/readyz`` answers 503 ``worker_down`` (``executor.api.readiness.mark_worker_down``, in Redis:
    every API process of the serve sees it) until the new pool answers a ping by its own name. The new pool takes the
    queued messages at once; those its predecessor held unacked come back after the visibility timeout (late acks),
    so no job is lost. Orphaned pool processes of the dead one are killed first (its process group). Backoff
    ``backoff_s`` doubling to ``max_backoff_s``; a pool that ran ``stable_s`` starts again from ``backoff_s``.

    ``wait_warm`` (a deployment that decides): a pool counts as up once one of its processes has its decider warm
    (``executor.worker.celery``); until then, from the first start too, ``/readyz`` says ``decider_warming``.
    """

    def __init__(self, redis_url: str, *, concurrency: int = 2, env: dict[str, str] | None = None,
                 log_file: Path | None = None, poll_s: float = 0.5, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 stable_s: float = 60.0, wait_warm: bool = False) -> None:
        self.redis_url, self.concurrency, self.env, self.log_file = redis_url, concurrency, env, log_file
        self.wait_warm = wait_warm
        self.poll_s, self.backoff_s, self.max_backoff_s, self.stable_s = poll_s, backoff_s, max_backoff_s, stable_s
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self._hostname = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="toolrail-worker-supervisor", daemon=True)

    def start(self) -> "SupervisedWorker":
        self._thread.start()  # it starts the pool: a pool dies with the thread that started it (toolrail.lifeline)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)  # the thread stops its pool (SIGTERM, SIGKILL after 10 s)
        stop_process(self.proc)  # never started, or the thread is stuck: from here

    def _spawn(self) -> None:
        if self.wait_warm:  # a warm mark left by an earlier pool says nothing of this one
            _quietly(redis.Redis.from_url(self.redis_url, socket_connect_timeout=2).delete, DECIDER_WARM_KEY)
        self._hostname = f"toolrail-serve-{os.getpid()}-{self.restarts}@{socket.gethostname()}"
        self.proc = start_worker(self.redis_url, concurrency=self.concurrency, env=self.env, hostname=self._hostname,
                                 log_file=self.log_file)

    def _watch(self) -> None:
        try:
            self._spawn()
            self._supervise()
        finally:
            stop_process(self.proc)

    def _supervise(self) -> None:
        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2, socket_timeout=5)
        backoff, started = self.backoff_s, time.monotonic()
        if self.wait_warm:
            self._await_answer(client, {"reason": "decider_warming", "since": time.time()})
        while not self._stop.wait(self.poll_s):
            proc = self.proc
            if proc is None or (returncode := proc.poll()) is None:
                continue
            ran_s = time.monotonic() - started
            backoff = self.backoff_s if ran_s >= self.stable_s else backoff
            _kill_group(proc.pid)  # its pool processes, orphaned: they would hold messages nobody acks
            self._restore(client, proc.pid)  # what it held goes back now, not after the visibility timeout
            info = {"reason": "worker_down", "pid": proc.pid, "returncode": returncode, "restarts": self.restarts,
                    "since": time.time()}
            if returncode == TOOL_CHECK_EXIT:  # its tools cannot run: starting it again cannot help
                log.error("worker.refused_to_start", pid=proc.pid, returncode=returncode)
                _quietly(mark_worker_down, client, {**info, "reason": "worker_refused_to_start"}, 7 * 86400)
                return
            log.warning("worker.died", pid=proc.pid, returncode=returncode, ran_s=round(ran_s, 1),
                        restart_in_s=backoff, restarts=self.restarts)
            _quietly(mark_worker_down, client, info)
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, self.max_backoff_s)
            self.restarts += 1
            self._spawn()
            started = time.monotonic()
            log.info("worker.restarted", pid=self.proc.pid, restarts=self.restarts)
            self._await_answer(client, info)

    def _restore(self, client: redis.Redis, pid: int) -> None:
        from kombu import Connection  # noqa: PLC0415


        transport = celery_config(self.redis_url)["broker_transport"]
        try:
            restored = liveness.restore_holder(lambda: Connection(self.redis_url, transport=transport), client,
                                               liveness.holder_id(pid))
            log.info("worker.messages_restored", pid=pid, messages=restored)
        except Exception as exc:  # noqa: BLE001 - the reconciler restores them later (its own check)
            log.warning("worker.restore_failed", pid=pid, error=type(exc).__name__)

    def _await_answer(self, client: redis.Redis, info: dict) -> None:
        """Until the new pool answers a ping by its name (and, with ``wait_warm``, has a warm decider: then it is
        marked up), dies, or the supervisor stops."""
        from celery import Celery  # noqa: PLC0415

        probe = Celery("toolrail-supervisor", broker=self.redis_url)
        answered = False
        while not self._stop.is_set() and self.proc is not None and self.proc.poll() is None:
            try:
                answered = answered or bool(probe.control.ping(destination=[self._hostname], timeout=1.0))
                if answered and (not self.wait_warm or client.exists(DECIDER_WARM_KEY)):
                    _quietly(mark_worker_down, client, None)
                    log.info("worker.answering", pid=self.proc.pid, restarts=self.restarts, warm=self.wait_warm)
                    return
                if answered:
                    info = {**info, "reason": "decider_warming"}
            except (redis.RedisError, OSError):
                pass
            _quietly(mark_worker_down, client, info)  # keep the mark alive while it starts
            self._stop.wait(self.poll_s)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _quietly(fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except redis.RedisError as exc:  # Redis down: /readyz says so itself
        log.warning("worker.mark_failed", error=type(exc).__name__)


@dataclass
class LocalStack:
    """Redis + worker pool + API in a background thread, torn down on exit."""

    host: str = "127.0.0.1"
    port: int = 0
    concurrency: int = 2
    with_worker: bool = True
    worker_env: dict[str, str] = field(default_factory=dict)
    redis_url: str | None = None
    cache_dir: Path | None = None
    log_file: Path | None = None
    #: how long ``start`` waits for the worker pool (and the API) to answer
    start_timeout_s: float = 90.0
    #: how long ``stop`` lets the worker pool finish before it is killed
    stop_grace_s: float = 10.0
    _redis: EmbeddedRedis | None = None
    _worker: subprocess.Popen | None = None
    _server: object | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *, wait_workers: bool = True) -> "LocalStack":
        started = time.monotonic()
        settings = get_settings()
        url, self._redis = ensure_redis(self.redis_url or settings.redis_url, self.cache_dir or settings.cache_dir or DEFAULT_CACHE_DIR,
                                        redis_server=settings.redis_server)
        log.info("stack.redis", url=display_url(url), source="embedded" if self._redis else "given")
        self.redis_url = url
        os.environ["REDIS_URL"] = url
        get_settings.cache_clear()
        if self.with_worker:
            self._worker = start_worker(url, concurrency=self.concurrency, env=self.worker_env, log_file=self.log_file)
        self._start_api()
        if self.with_worker and wait_workers:
            wait_for_workers(url, count=1, timeout_s=max(0.5, self.start_timeout_s - (time.monotonic() - started)))
        return self

    def _start_api(self) -> None:
        settings = get_settings()
        app = create_app(settings, Runtime.from_settings(settings, redis_url=self.redis_url))
        self._server, self._thread, base_url = serve_in_thread(app, host=self.host, port=self.port,
                                                               timeout_s=min(30.0, self.start_timeout_s))
        self.port = int(base_url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True  # type: ignore[attr-defined]
            if self._thread:
                self._thread.join(timeout=10)
        stop_process(self._worker, grace_s=self.stop_grace_s)
        if self._redis is not None:
            self._redis.stop()

    def __enter__(self) -> "LocalStack":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
