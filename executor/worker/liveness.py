"""Worker liveness: a dead worker's messages back in their queues within seconds, not after the visibility timeout.

With late acks a message a worker has taken stays in kombu's ``unacked`` hash until it is acked. When the worker's
main process dies that message waited for Redis's visibility timeout (3,600 s by default): its job sat ``running``
for an hour. Now:

- each consumer (a Celery worker's main process) is a *holder* named ``host:pid``; the broker transport
  (``executor.worker.broker``) notes every delivery tag it takes under ``HELD_PREFIX + holder`` and forgets it on ack
  or reject, and a thread beats every ``BEAT_EVERY_S`` into ``BEATS_KEY`` (a sorted set: holder → last beat);
- ``toolrail serve``'s supervisor, seeing its pool's main process die, restores that holder's messages at once
  (:func:`restore_holder`); anywhere else the API's reconciler restores the messages of every holder that has not
  beaten for ``DEAD_AFTER_S`` (:func:`restore_dead_workers`, every ``CHECK_EVERY_S``);
- restoring is kombu's own ``restore_by_tag`` (one transaction: a tag restored twice is pushed once), and a message
  redelivered to a task that may run twice is safe (idempotency records; the ledger applies a key once);
- kombu takes a message (``BRPOP``) before it notes it as unacked: a main process killed between the two loses it,
  held by nobody. So each death is noted in ``DEATHS_KEY``, and ``REQUEUE_AFTER_S`` later the reconciler queues
  again the *pending* work (calls and decisions not started) of jobs unchanged since the death (:func:`deaths_due`,
  ``reconcile_once(pending_only=True)``): a needless copy is a no-op task, and nothing running runs twice.

A pool process killed alone needs none of this: its main process rejects the message and requeues it at once
(``task_reject_on_worker_lost``). The visibility timeout stays as the last resort.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from toolrail.logging import get_logger

__all__ = ["BEATS_KEY", "BEAT_EVERY_S", "CHECK_EVERY_S", "DEAD_AFTER_S", "DEATHS_KEY", "HELD_PREFIX", "REQUEUE_AFTER_S",
           "Heartbeat", "current_holder", "dead_holders", "deaths_due", "forget_holder", "holder_id",
           "restore_dead_workers", "restore_holder"]

log = get_logger("toolrail.liveness")

#: Sorted set: holder → unix time of its last beat.
BEATS_KEY = "tr:workers:beats"
#: Hash per holder: delivery tag → unix time it was taken.
HELD_PREFIX = "tr:workers:held:"
BEAT_EVERY_S = 2.0
#: A holder whose last beat is older than this is dead: five beats missed.
DEAD_AFTER_S = 10.0
#: How often the reconciler looks for dead holders.
CHECK_EVERY_S = 2.0
#: Sorted set: dead holder → when it was found dead, until its pending work is queued again.
DEATHS_KEY = "tr:workers:deaths"
#: How long after a death its jobs' pending work is queued again: restored messages and live workers move first.
REQUEUE_AFTER_S = 5.0

_holder: str | None = None


def holder_id(pid: int | None = None) -> str:
    """The holder name of process ``pid`` (this one) on this host."""
    return f"{socket.gethostname()}:{pid or os.getpid()}"


def current_holder() -> str | None:
    """This process's holder name when it consumes messages (a worker's main process), else None."""
    return _holder


def forget_holder() -> None:
    """In a forked pool process: it consumes nothing (its main process takes and acks the messages)."""
    global _holder
    _holder = None


class Heartbeat:
    """This process as a holder: its beat, every ``every_s`` in a daemon thread, until :meth:`stop`."""

    def __init__(self, client: redis.Redis, *, every_s: float = BEAT_EVERY_S) -> None:
        global _holder
        self.client, self.every_s, self.holder = client, every_s, holder_id()
        _holder = self.holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolrail-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """A clean exit: kombu restores what it holds itself (``restore_at_shutdown``); the beat and list go."""
        self._stop.set()
        try:
            self.client.pipeline().zrem(BEATS_KEY, self.holder).delete(HELD_PREFIX + self.holder).execute()
        except redis.RedisError:
            pass

    def _beat(self) -> None:
        try:
            self.client.zadd(BEATS_KEY, {self.holder: time.time()})
        except redis.RedisError as exc:  # Redis away: the worker cannot consume either; beat again next time
            log.warning("heartbeat.failed", error=type(exc).__name__)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._beat()


def dead_holders(client: redis.Redis, *, dead_after_s: float = DEAD_AFTER_S) -> list[str]:
    """Holders whose last beat is older than ``dead_after_s``."""
    stale = client.zrangebyscore(BEATS_KEY, "-inf", time.time() - dead_after_s)
    return [h.decode() if isinstance(h, bytes) else str(h) for h in stale]


def restore_holder(connect: Callable[[], Any], client: redis.Redis, holder: str) -> int:
    """Put every message ``holder`` took and never acked back at the head of its queue; forget the holder, note its
    death (:func:`deaths_due`).

    ``connect`` opens a kombu connection to the broker (a Celery app's ``connection_for_write``). Returns how many
    messages went back (a tag already acked or restored counts none)."""
    key = HELD_PREFIX + holder
    tags = [t.decode() if isinstance(t, bytes) else str(t) for t in client.hkeys(key)]
    restored = 0
    if tags:
        with connect() as connection:
            channel = connection.default_channel
            for tag in tags:
                if client.hexists(channel.unacked_key, tag):
                    channel.qos.restore_by_tag(tag, client=channel.client)
                    restored += 1
    client.pipeline().delete(key).zrem(BEATS_KEY, holder).zadd(DEATHS_KEY, {holder: time.time()}).execute()
    if restored:
        log.warning("worker.messages_restored", holder=holder, messages=restored)
    return restored


def restore_dead_workers(connect: Callable[[], Any], client: redis.Redis, *, dead_after_s: float = DEAD_AFTER_S) -> int:
    """:func:`restore_holder` for every holder that stopped beating; how many messages went back."""
    return sum(restore_holder(connect, client, holder) for holder in dead_holders(client, dead_after_s=dead_after_s))


def deaths_due(client: redis.Redis, *, grace_s: float = REQUEUE_AFTER_S) -> float | None:
    """When the latest death noted more than ``grace_s`` ago was found (None: none), each death claimed by one caller:
    the pending work of jobs unchanged since then is to be queued again, by that caller alone."""
    due = client.zrangebyscore(DEATHS_KEY, "-inf", time.time() - grace_s, withscores=True)
    return max((at for holder, at in due if client.zrem(DEATHS_KEY, holder)), default=None)
