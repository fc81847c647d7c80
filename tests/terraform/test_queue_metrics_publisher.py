"""The queue metric publisher Lambda (terraform/modules/executor/queue_metrics): RESP client,
depth and oldest-message age, CloudWatch datums; against a fake and against a real redis-server."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest
from tf_parse import MODULES

_PATH = MODULES / "executor" / "queue_metrics" / "queue_metrics.py"
_spec = importlib.util.spec_from_file_location("toolrail_queue_metrics", _PATH)
qm = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = qm
_spec.loader.exec_module(qm)


class FakeRedis:
    """Lists and strings, enough for LLEN / LINDEX / GET / SET / DEL."""

    def __init__(self) -> None:
        self.lists: dict[str, list[bytes]] = {}
        self.strings: dict[str, bytes] = {}

    def push(self, queue: str, message: bytes) -> None:  # kombu: LPUSH
        self.lists.setdefault(queue, []).insert(0, message)

    def pop(self, queue: str) -> bytes:  # kombu: BRPOP
        return self.lists[queue].pop()

    def execute(self, *args):
        command, key, *rest = args
        if command == "LLEN":
            return len(self.lists.get(key, []))
        if command == "LINDEX":
            items = self.lists.get(key, [])
            return items[rest[0]] if items else None
        if command == "GET":
            return self.strings.get(key)
        if command == "SET":
            self.strings[key] = rest[0].encode()
            return "OK"
        if command == "DEL":
            return int(self.strings.pop(key, None) is not None)
        raise AssertionError(command)


def test_encode_command_is_a_resp_array_of_bulk_strings():
    assert qm.encode_command("LLEN", "tool.x", -1) == b"*3\r\n$4\r\nLLEN\r\n$6\r\ntool.x\r\n$2\r\n-1\r\n"


@pytest.mark.parametrize(
    ("wire", "value"),
    [(b"+OK\r\n", "OK"), (b":42\r\n", 42), (b"$3\r\nabc\r\n", b"abc"), (b"$-1\r\n", None), (b"*2\r\n:1\r\n$1\r\nx\r\n", [1, b"x"])],
)
def test_read_reply_parses_resp2(wire, value):
    stream = io.BytesIO(wire)
    assert qm.read_reply(stream.readline, stream.read) == value


def test_read_reply_raises_on_error_reply():
    stream = io.BytesIO(b"-WRONGPASS invalid username-password pair\r\n")
    with pytest.raises(qm.RespError, match="WRONGPASS"):
        qm.read_reply(stream.readline, stream.read)


def test_age_grows_while_the_same_message_is_oldest_and_resets_when_it_is_consumed():
    redis = FakeRedis()
    redis.push("tool.transfer", b"m1")
    redis.push("tool.transfer", b"m2")
    (first,) = qm.sample_queues(redis, ["tool.transfer"], now=1000.0)
    assert (first.depth, first.oldest_age_s) == (2, 0.0)
    (later,) = qm.sample_queues(redis, ["tool.transfer"], now=1090.0)
    assert (later.depth, later.oldest_age_s) == (2, 90.0)
    redis.pop("tool.transfer")  # m1 consumed; m2 is now the oldest, first seen at the tail now
    (after,) = qm.sample_queues(redis, ["tool.transfer"], now=1150.0)
    assert (after.depth, after.oldest_age_s) == (1, 0.0)
    redis.pop("tool.transfer")
    (empty,) = qm.sample_queues(redis, ["tool.transfer"], now=1200.0)
    assert (empty.depth, empty.oldest_age_s) == (0, 0.0)
    assert not redis.strings, "an empty queue leaves no tail record"


def test_queues_are_measured_independently():
    redis = FakeRedis()
    redis.push("decide", b"d")
    samples = qm.sample_queues(redis, ["decide", "tool.get_weather"], now=5.0)
    assert [(s.queue, s.depth) for s in samples] == [("decide", 1), ("tool.get_weather", 0)]


def test_metric_data_carries_environment_and_queue_dimensions():
    data = qm.build_metric_data([qm.QueueSample("decide", 3, 12.5)], environment="dev", timestamp=1.0)
    assert {d["MetricName"]: d["Value"] for d in data} == {"QueueDepth": 3.0, "QueueOldestAgeSeconds": 12.5}
    for datum in data:
        assert datum["Dimensions"] == [{"Name": "Environment", "Value": "dev"}, {"Name": "Queue", "Value": "decide"}]


def test_terraform_feeds_the_publisher_what_it_reads(stack):
    lambda_fn = stack.modules["executor"].resource("aws_lambda_function", "queue_metrics")
    variables = set(lambda_fn["environment"][0]["variables"])
    source = _PATH.read_text()
    for name in ("QUEUES", "REDIS_HOST", "REDIS_PORT", "REDIS_SECRET_ARN", "METRIC_NAMESPACE", "ENVIRONMENT"):
        assert name in variables and f'"{name}"' in source


def test_real_redis_server_round_trip(tmp_path):
    embed = pytest.importorskip("toolrail.redis_embed")
    try:
        server = embed.EmbeddedRedis(data_dir=tmp_path).start()
    except embed.EmbeddedRedisError as exc:
        pytest.skip(f"no redis-server: {exc}")
    try:
        conn = qm.RedisConnection("127.0.0.1", server.port, password=None, tls=False)
        try:
            body = json.dumps({"body": "x", "properties": {"delivery_tag": "t1"}})
            conn.execute("LPUSH", "tool.get_weather", body)
            conn.execute("LPUSH", "tool.get_weather", "newer")
            (sample,) = qm.sample_queues(conn, ["tool.get_weather"], now=100.0)
            assert sample.depth == 2
            (sample,) = qm.sample_queues(conn, ["tool.get_weather"], now=160.0)
            assert sample.oldest_age_s == 60.0
            assert conn.execute("LINDEX", "tool.get_weather", -1) == body.encode()
        finally:
            conn.close()
    finally:
        server.stop()
