"""The broker transport (``executor.worker.broker``): kombu's Redis transport with one client per channel.

Real Redis (the session's), a database of its own: a queue of this test's, published to, consumed
and acked through kombu, as the API and the workers do.
"""

from __future__ import annotations

import uuid

from kombu import Connection

from executor.worker.broker import Transport
from executor.worker.config import celery_config
from tests.harness.databases import own_database


def test_redis_brokers_get_the_transport() -> None:
    assert celery_config("redis://127.0.0.1:6379/0")["broker_transport"] == "executor.worker.broker:Transport"
    assert celery_config("rediss://example:6380/0")["broker_transport"] is None  # kombu's own, by the URL's scheme


def test_one_client_per_channel_until_its_pool_is_replaced() -> None:
    with Connection(own_database(__name__), transport=Transport) as conn:
        channel = conn.default_channel
        client = channel._create_client()  # noqa: SLF001 - the method kombu calls per publish and ack
        assert channel._create_client() is client  # noqa: SLF001
        assert client.connection_pool is channel.pool
        assert channel.client is not client  # the consumer's own (asynchronous pool), as kombu keeps it
        channel._disconnect_pools()  # noqa: SLF001 - what kombu does after a fork or a lost connection
        again = channel._create_client()  # noqa: SLF001
        assert again is not client and again.connection_pool is channel.pool and again.ping()


def test_a_message_is_published_delivered_and_acked_once() -> None:
    name = f"t-broker-{uuid.uuid4().hex[:8]}"
    with Connection(own_database(__name__), transport=Transport,
                    transport_options={"visibility_timeout": 60}) as conn:
        queue = conn.SimpleQueue(name)
        try:
            for n in range(3):
                queue.put({"n": n})
            got = []
            for _ in range(3):
                message = queue.get(timeout=5)
                got.append(message.payload["n"])
                message.ack()
            assert got == [0, 1, 2]
            channel = queue.channel
            client = channel._create_client()  # noqa: SLF001
            assert client.hlen(channel.unacked_key) == 0 and client.zcard(channel.unacked_index_key) == 0
            assert client.llen(name) == 0
        finally:
            queue.close()
