"""Idempotency records for side-effecting calls, keyed by (job id, call id).

The Powertools/Stripe pattern: before a side-effecting call runs, take an
``in_progress`` record with an expiry (the lock); when it ends, store the outcome for
long. A redelivered call finds the outcome and replays it; finds a live lock and waits
(``CallInProgressError``, retryable); finds a different payload under the same key and is
refused (``IdempotencyConflictError``). If a worker dies between the side effect and the
record, the lock expires and the call runs again with the *same* idempotency key, which
the tool hands to the system it changes (the ledger applies a key once).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import redis

from executor.errors import CallInProgressError, IdempotencyConflictError

__all__ = ["Begin", "IdempotencyStore", "payload_hash"]


def payload_hash(name: str, arguments: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([name, arguments], sort_keys=True, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class Begin:
    """The outcome of ``begin``: run it (``replay is None``) or replay a stored outcome."""

    key: str
    replay: dict[str, Any] | None = None


def _owner_is_dead(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class IdempotencyStore:
    def __init__(self, client: redis.Redis, *, prefix: str = "tr:idem", ttl_s: int = 24 * 3600) -> None:
        self._redis = client
        self._prefix = prefix
        self._ttl_s = ttl_s

    def key(self, job_id: str, call_id: str) -> str:
        return f"{self._prefix}:{job_id}:{call_id}"

    def begin(self, job_id: str, call_id: str, digest: str, *, lock_s: float) -> Begin:
        """Take the lock, or learn what happened before."""
        key = self.key(job_id, call_id)
        record = {"state": "in_progress", "hash": digest, "owner": f"{socket.gethostname()}:{os.getpid()}",
                  "since": time.time()}
        if self._redis.set(key, json.dumps(record), nx=True, px=int(lock_s * 1000)):
            return Begin(key)
        raw = self._redis.get(key)
        if raw is None:  # expired between the two calls: try once more
            return self.begin(job_id, call_id, digest, lock_s=lock_s)
        existing = json.loads(raw)
        if existing.get("hash") != digest:
            raise IdempotencyConflictError("this call was already run with different arguments",
                                           key=key, job_id=job_id, call_id=call_id)
        if existing["state"] == "completed":
            return Begin(key, replay=existing["outcome"])
        if _owner_is_dead(existing.get("owner", "")):
            # The delivery that held the lock died on this host (its worker was killed): take over now
            # rather than waiting for expiry. The tool still gets the same idempotency key.
            if self._redis.delete(key):
                return self.begin(job_id, call_id, digest, lock_s=lock_s)
        ttl_ms = self._redis.pttl(key)
        raise CallInProgressError("another delivery of this call is running", key=key, owner=existing.get("owner"),
                                  retry_in_s=max(0.5, ttl_ms / 1000 if ttl_ms and ttl_ms > 0 else 1.0))

    def complete(self, job_id: str, call_id: str, digest: str, outcome: dict[str, Any]) -> None:
        """Store the outcome (``{"ok": bool, "result"|"error": ...}``) for replay."""
        record = {"state": "completed", "hash": digest, "outcome": outcome, "at": time.time()}
        self._redis.set(self.key(job_id, call_id), json.dumps(record, ensure_ascii=False, default=str), ex=self._ttl_s)
