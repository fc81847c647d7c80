"""Celery's Redis broker transport, with one Redis client per channel instead of one per operation.

kombu's Redis channel wraps its connection pool in a new ``redis.Redis`` for every publish, ack and
unacked-index write (``conn_or_acquire`` / ``pipe_or_acquire``): at least three per task between the
API and the worker, and building one costs about 0.1 ms of CPU (its table of response callbacks). A
client holds nothing of its own but that table and the pool (each command takes a connection from
the pool and gives it back), so one client per channel serves every such operation; it is built
again when the channel replaces its pool (after a connection error). Messages, acks, the unacked
index and its visibility timeout are kombu's, unchanged.

Its QoS also notes, in a consuming worker's main process, which delivery tags that process holds unacked
(``executor.worker.liveness``): when the process dies, exactly those go back to their queues at once.

``celery_config`` names this transport for ``redis://`` brokers (``broker_transport``).
"""

from __future__ import annotations

import time
from typing import Any

from kombu.transport import redis as kombu_redis

from executor.worker import liveness

__all__ = ["Channel", "QoS", "Transport"]


class QoS(kombu_redis.QoS):
    """kombu's ack emulation; a holder's (``liveness.current_holder``) unacked tags also listed under its name."""

    def append(self, message: Any, delivery_tag: Any) -> None:
        super().append(message, delivery_tag)
        holder = liveness.current_holder()
        if holder is not None:
            with self.pipe_or_acquire() as pipe:
                pipe.hset(liveness.HELD_PREFIX + holder, delivery_tag, int(time.time())).execute()

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        pipe = super()._remove_from_indices(delivery_tag, pipe)  # ack, reject and restore all come through here
        holder = liveness.current_holder()
        return pipe if holder is None else pipe.hdel(liveness.HELD_PREFIX + holder, delivery_tag)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; its synchronous client is built once per pool."""

    QoS = QoS

    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's BRPOP client: kombu keeps it itself (``Channel.client``)
            return super()._create_client(asynchronous=True)
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel
