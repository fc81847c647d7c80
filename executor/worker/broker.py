"""Celery's Redis broker transport, with one Redis client per channel instead of one per operation.

kombu's Redis channel wraps its connection pool in a new ``redis.Redis`` for every publish, ack and
unacked-index write (``conn_or_acquire`` / ``pipe_or_acquire``): at least three per task between the
API and the worker, and building one costs about 0.1 ms of CPU (its table of response callbacks). A
client holds nothing of its own but that table and the pool (each command takes a connection from
the pool and gives it back), so one client per channel serves every such operation; it is built
again when the channel replaces its pool (after a connection error). Messages, acks, the unacked
index and its visibility timeout are kombu's, unchanged.

``celery_config`` names this transport for ``redis://`` brokers (``broker_transport``).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

__all__ = ["Channel", "Transport"]


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; its synchronous client is built once per pool."""

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
