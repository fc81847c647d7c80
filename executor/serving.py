"""``toolrail serve`` and ``toolrail worker``: the processes of a deployment on this machine.

``serve`` runs the job API (one process, or uvicorn's supervisor over several sharing one socket) with a supervised
Celery worker pool and, without a Redis named, an embedded one; ``worker`` becomes a Celery worker.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import tempfile
import threading
import time

import httpx
import uvicorn
from uvicorn.supervisors import Multiprocess

from executor.api.app import app_from_environment
from executor.metrics import MULTIPROCESS_DIR_ENV
from executor.stack import SupervisedWorker, deployment_queues
from toolrail.logging import configure_logging, get_logger
from toolrail.redis_embed import ensure_redis, redis_url
from toolrail.settings import check_redis_url, display_url, get_settings

__all__ = ["serve", "tcp_listener", "worker"]

def serve(args: argparse.Namespace) -> int:
    configure_logging()
    log = get_logger("toolrail.serve")
    if args.api_workers is not None and args.api_workers < 1:
        print(f"--api-workers must be at least 1, not {args.api_workers}", file=sys.stderr)
        return 2
    settings = get_settings()
    host = args.host or settings.host
    port = args.port or settings.port
    if not settings.tenants_by_key() and not _is_loopback(host):
        print(f"refusing to bind {host}: no API keys are configured (set TOOLRAIL_API_KEYS=key:tenant,...) "
              "— without keys only loopback addresses are allowed", file=sys.stderr)
        return 2
    if args.redis_url:
        check_redis_url(args.redis_url, source="--redis-url")
    try:  # the port first: a used one is refused before a Redis, a worker pool or another serve's Redis is touched
        listener = tcp_listener(host, port)
    except OSError as exc:
        print(f"toolrail serve: cannot listen on {host}:{port}: {_reason(exc)} (another toolrail serve or another "
              "program holds it: stop it, or choose another port with --port)", file=sys.stderr)
        return 2
    source = "--redis-url" if args.redis_url else "REDIS_URL" if settings.redis_url else "embedded"
    url, embedded = ensure_redis(args.redis_url or settings.redis_url, settings.cache_dir, redis_server=settings.redis_server)
    os.environ["REDIS_URL"] = url
    get_settings.cache_clear()
    settings = get_settings()
    log.info("serve.redis", url=display_url(url), source=source)
    worker = None
    try:
        if not args.no_worker:  # every queue of the deployment (webhooks included), restarted when it dies
            worker = SupervisedWorker(url, concurrency=args.concurrency or settings.worker_concurrency,
                                      wait_warm=settings.decider != "none").start()  # ready once it can decide
        api_workers = args.api_workers or settings.api_workers
        log.info("serve.listening", url=f"http://{host}:{port}", api_processes=api_workers)
        _announce_when_ready(host, port, url, ready_path="/healthz" if args.no_worker else "/readyz")
        if api_workers == 1:  # the app is built from the environment, as each of several processes builds it
            config = uvicorn.Config(app_from_environment(), log_level="warning", access_log=False)
            uvicorn.Server(config).run(sockets=[listener])
        else:  # uvicorn's workers: each process builds its app from the environment (REDIS_URL is set above)
            with tempfile.TemporaryDirectory(prefix="toolrail-metrics-") as shared:
                os.environ[MULTIPROCESS_DIR_ENV] = shared
                _serve_processes(listener, api_workers)
    finally:
        listener.close()
        if worker is not None:
            worker.stop()
        if embedded:
            embedded.stop()
    return 0


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _announce_when_ready(host: str, port: int, redis_url: str, *, ready_path: str) -> None:
    """Once ``ready_path`` answers 200 (``/readyz``: the API, Redis and a warm worker pool; ``/healthz`` with
    ``--no-worker``), print on stdout the API's URL and the ``export REDIS_URL=…`` line a second process (``toolrail
    mcp stdio``, another ``toolrail worker``) needs: an embedded Redis is on a random port. A daemon thread."""
    probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104 - probing only

    def origin(name: str) -> str:
        return f"http://{f'[{name}]' if ':' in name else name}:{port}"

    probe = origin(probe_host) + ready_path
    shown = display_url(redis_url)
    masked = "   # password masked: the REDIS_URL you gave" if shown != redis_url else ""

    def announce() -> None:
        while True:
            try:
                if httpx.get(probe, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        print(f"toolrail serve: ready at {origin(host)}", flush=True)
        print(f"export REDIS_URL={shown}{masked}", flush=True)
        print(f"console: {origin(probe_host)}/console/", flush=True)

    threading.Thread(target=announce, name="toolrail-serve-ready", daemon=True).start()


def _serve_processes(listener: socket.socket, processes: int) -> None:
    """uvicorn's supervisor over ``processes`` API processes sharing one listening socket, bound here.

    uvicorn binds that socket with ``proto`` 0 (``Config.bind_socket``); accepted sockets inherit it, and
    asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto`` is ``IPPROTO_TCP``: every keep-alive
    request after the first then waits ~40 ms for the client's delayed ACK (Kludex/uvicorn#3149, open).
    Bound here with ``IPPROTO_TCP``, every process's connections get ``TCP_NODELAY`` as one process's do.
    """
    config = uvicorn.Config("executor.api.app:app_from_environment", factory=True, workers=processes, log_level="warning",
                            access_log=False)
    Multiprocess(config, sockets=[listener]).run()


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket whose accepted connections asyncio gives ``TCP_NODELAY`` (its ``proto`` is ``IPPROTO_TCP``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    listener.set_inheritable(True)
    return listener


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def worker(args: argparse.Namespace) -> int:
    url = redis_url(get_settings())  # no REDIS_URL: one line (RedisNotConfiguredError), never a default port
    queues = args.queues or ",".join(deployment_queues(url))
    concurrency = args.concurrency or get_settings().worker_concurrency
    argv = [sys.executable, "-m", "celery", "-A", "executor.worker.celery", "worker", "-Q", queues, "-c", str(concurrency),
            "--loglevel", args.loglevel, "--without-gossip", "--without-mingle"]
    os.execvp(argv[0], argv)
    return 0  # pragma: no cover
