"""Publish the depth and oldest-message age of toolrail's Celery queues to CloudWatch.

Runs as a Lambda function once a minute (EventBridge schedule). Celery's Redis transport keeps
every queue as a Redis list named after the queue: producers LPUSH, workers BRPOP, so ``LLEN`` is
the backlog and the element at index -1 is the oldest message. Kombu messages carry no enqueue
time, so the age is measured by watching the tail: the publisher remembers a fingerprint of the
tail message and when it first saw it (in Redis, under ``toolrail:queue-metrics:tail:<queue>``);
while the same message stays at the tail, its age grows. Precision is one schedule period.

Dependencies: the standard library (RESP over TLS) and the boto3 that the Lambda runtime ships.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["QueueSample", "RedisConnection", "RespError", "build_metric_data", "handler", "sample_queues"]

TAIL_KEY_PREFIX = "toolrail:queue-metrics:tail:"
#: Tail records outlive a few missed runs, then expire on their own.
TAIL_KEY_TTL_S = 3600
DEFAULT_TIMEOUT_S = 5.0


class RespError(Exception):
    """Redis answered with an error reply, or the reply could not be parsed."""


class Redis(Protocol):
    """The four commands the publisher needs."""

    def execute(self, *args: str | bytes | int) -> Any: ...


def encode_command(*args: str | bytes | int) -> bytes:
    """One RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def read_reply(readline: Callable[[], bytes], read: Callable[[int], bytes]) -> Any:
    """Parse one RESP2 reply; ``readline`` returns a line with its CRLF, ``read(n)`` n bytes."""
    line = readline()
    if not line.endswith(b"\r\n"):
        raise RespError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise RespError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        length = int(body)
        if length < 0:
            return None
        data = read(length + 2)
        return data[:-2]
    if kind == b"*":
        count = int(body)
        if count < 0:
            return None
        return [read_reply(readline, read) for _ in range(count)]
    raise RespError(f"unexpected reply type {kind!r}")


class RedisConnection:
    """A minimal RESP2 client over one TLS (or plain, for tests) socket."""

    def __init__(self, host: str, port: int, *, password: str | None, tls: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        raw = socket.create_connection((host, port), timeout=timeout_s)
        if tls:
            context = ssl.create_default_context()
            raw = context.wrap_socket(raw, server_hostname=host)
        self._sock = raw
        self._file = raw.makefile("rb")
        if password:
            self.execute("AUTH", password)

    def execute(self, *args: str | bytes | int) -> Any:
        self._sock.sendall(encode_command(*args))
        return read_reply(self._file.readline, self._file.read)

    def close(self) -> None:
        self._file.close()
        self._sock.close()


@dataclass(frozen=True)
class QueueSample:
    """One queue's state at one moment."""

    queue: str
    depth: int
    oldest_age_s: float


def _fingerprint(message: bytes) -> str:
    return hashlib.sha256(message).hexdigest()[:32]


def sample_queues(redis: Redis, queues: Iterable[str], *, now: float) -> list[QueueSample]:
    """Depth and oldest-message age of each queue, updating the tail records in Redis."""
    samples = []
    for queue in queues:
        depth = int(redis.execute("LLEN", queue))
        tail_key = TAIL_KEY_PREFIX + queue
        age = 0.0
        if depth == 0:
            redis.execute("DEL", tail_key)
        else:
            tail = redis.execute("LINDEX", queue, -1)
            if tail is not None:
                fingerprint = _fingerprint(tail)
                record = redis.execute("GET", tail_key)
                seen_fingerprint, _, seen_at = (record or b"").decode().partition("|")
                if seen_fingerprint == fingerprint:
                    age = max(0.0, now - float(seen_at))
                else:
                    # A new message reached the tail: the previous one was consumed.
                    redis.execute("SET", tail_key, f"{fingerprint}|{now}", "EX", TAIL_KEY_TTL_S)
        samples.append(QueueSample(queue=queue, depth=depth, oldest_age_s=age))
    return samples


def build_metric_data(samples: Sequence[QueueSample], *, environment: str, timestamp: float) -> list[dict[str, Any]]:
    """CloudWatch MetricData entries: QueueDepth and QueueOldestAgeSeconds per queue."""
    data = []
    for sample in samples:
        dimensions = [{"Name": "Environment", "Value": environment}, {"Name": "Queue", "Value": sample.queue}]
        data.append({"MetricName": "QueueDepth", "Dimensions": dimensions, "Timestamp": timestamp, "Value": float(sample.depth), "Unit": "Count"})
        data.append(
            {"MetricName": "QueueOldestAgeSeconds", "Dimensions": dimensions, "Timestamp": timestamp, "Value": sample.oldest_age_s, "Unit": "Seconds"}
        )
    return data


def _chunks(items: Sequence[dict[str, Any]], size: int) -> Iterable[Sequence[dict[str, Any]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def handler(event: dict[str, Any] | None = None, context: Any = None) -> dict[str, Any]:
    """Lambda entry point."""
    import boto3  # the Lambda runtime provides it; imported here so tests need no AWS SDK

    queues = json.loads(os.environ["QUEUES"])
    environment = os.environ["ENVIRONMENT"]
    namespace = os.environ.get("METRIC_NAMESPACE", "toolrail")
    secret = boto3.client("secretsmanager").get_secret_value(SecretId=os.environ["REDIS_SECRET_ARN"])
    token = json.loads(secret["SecretString"])["auth_token"]
    redis = RedisConnection(os.environ["REDIS_HOST"], int(os.environ.get("REDIS_PORT", "6379")), password=token)
    try:
        now = time.time()
        samples = sample_queues(redis, queues, now=now)
    finally:
        redis.close()
    cloudwatch = boto3.client("cloudwatch")
    for chunk in _chunks(build_metric_data(samples, environment=environment, timestamp=now), 500):
        cloudwatch.put_metric_data(Namespace=namespace, MetricData=list(chunk))
    summary = {s.queue: {"depth": s.depth, "oldest_age_s": round(s.oldest_age_s, 1)} for s in samples}
    print(json.dumps({"event": "queue_metrics.published", "environment": environment, "queues": summary}))
    return summary
