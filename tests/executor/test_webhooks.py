"""Signed webhooks: a real HTTP receiver, the real worker pool, the session Redis.

The receiver checks signatures with the Standard Webhooks algorithm written out here from the
spec (HMAC-SHA256 over ``id.timestamp.body`` with the base64-decoded ``whsec_`` key), not with
``executor.runs.webhooks.verify``. Tests that need settings the worker does not have (private
addresses refused, a short timeout) make the attempt in this process on a runtime whose key
prefix the worker never reads.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import shutil
import ssl
import subprocess
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from tests.harness.fixtures import WEBHOOK_SECRET
from tests.harness.jobs import wait_terminal
from tests.harness.receiver import Receiver, wait_for

from executor.errors import WebhookUrlError
from executor.metrics import OutcomeCollector
from executor.store.records import JobRecord, RedisJobStore
from executor.runs.webhooks import attempt_delivery, deliveries, notify_status, sign, validate_webhook_url, verify
from toolrail.redis_embed import free_port


def spec_signature_ok(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks check, from the spec: any of the space-separated ``v1,<base64>`` values matches."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(part == f"v1,{expected}" for part in headers["webhook-signature"].split(" "))


@pytest.fixture(scope="module")
def receiver() -> Receiver:
    with Receiver() as rec:
        yield rec


@pytest.fixture()
def local_rt(runtime):
    """A runtime on keys the worker never reads (prefix ``whtest``): its deliveries are made only by this process."""
    return dataclasses.replace(runtime, store=RedisJobStore(runtime.redis, prefix="whtest", ttl_s=3600))


def new_job(rt, url: str, status: str = "succeeded") -> JobRecord:
    job, _ = rt.store.create(JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=f"req-{uuid.uuid4().hex[:8]}",
                                       tenant="default", webhook_url=url))
    job.status = status  # type: ignore[assignment]
    return job


def finished(rt, job_id: str) -> list[dict[str, Any]] | None:
    records = deliveries(rt, job_id)
    return records if records and all(r["state"] != "pending" for r in records) else None


def webhook_counts(rt) -> dict[str, float]:
    for family in OutcomeCollector(rt.redis).collect():
        if family.name == "toolrail_webhook_deliveries":
            return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}
    return {}


def test_signed_delivery_checked_with_the_spec_algorithm(runtime, worker, receiver: Receiver) -> None:
    path = receiver.path()
    job = new_job(runtime, receiver.url(path))
    notify_status(runtime, job)
    (request,) = wait_for(lambda: receiver.seen(path))
    headers, body = request["headers"], request["body"]
    assert spec_signature_ok(WEBHOOK_SECRET, headers, body)
    assert headers["webhook-id"].startswith("msg_") and headers["content-type"] == "application/json"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    payload = json.loads(body)
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["job_id"] == job.job_id and payload["data"]["status"] == "succeeded"
    assert datetime.fromisoformat(payload["timestamp"].replace("Z", "+00:00")).tzinfo is not None
    assert verify(WEBHOOK_SECRET, headers, body)  # our own verifier agrees with the spec's
    assert not spec_signature_ok(WEBHOOK_SECRET, headers, body + b" ")  # and the check is not vacuous
    (record,) = wait_for(lambda: finished(runtime, job.job_id))
    assert record["state"] == "delivered" and record["id"] == headers["webhook-id"]
    assert [a["status"] for a in record["attempts"]] == [200]


def test_two_500s_then_200_delivers_on_the_third_attempt_with_one_id(runtime, worker, receiver: Receiver) -> None:
    path = receiver.path([500, 500])
    job = new_job(runtime, receiver.url(path), status="needs_review")
    notify_status(runtime, job)
    (record,) = wait_for(lambda: finished(runtime, job.job_id))
    seen = receiver.seen(path)
    assert len(seen) == 3
    assert len({r["headers"]["webhook-id"] for r in seen}) == 1
    assert all(spec_signature_ok(WEBHOOK_SECRET, r["headers"], r["body"]) for r in seen)
    assert len({r["body"] for r in seen}) == 1  # the same body on every attempt
    assert json.loads(seen[0]["body"])["type"] == "job.needs_review"
    assert record["state"] == "delivered"
    assert [a["status"] for a in record["attempts"]] == [500, 500, 200]
    assert [a["outcome"] for a in record["attempts"]] == ["retry", "retry", "delivered"]
    assert all(a["duration_s"] >= 0 and a["at"].endswith("Z") for a in record["attempts"])
    assert seen[1]["at"] - seen[0]["at"] >= 0.1 - 0.02  # backed off (0.2 s base, jitter x0.5..1.5)


def test_receiver_down_ends_failed_after_bounded_attempts(runtime, worker) -> None:
    before = webhook_counts(runtime).get("exhausted", 0)
    job = new_job(runtime, f"http://127.0.0.1:{free_port()}/nobody-listens", status="failed")
    started = time.monotonic()
    assert notify_status(runtime, job) is None
    assert time.monotonic() - started < 2.0  # the caller only queued it
    (record,) = wait_for(lambda: finished(runtime, job.job_id))
    assert record["state"] == "failed" and record["outcome"] == "exhausted"
    attempts = record["attempts"]
    assert len(attempts) == 4  # TOOLRAIL_WEBHOOK_MAX_ATTEMPTS of the worker
    assert all(a["outcome"] == "retry" and a["error"]["type"] == "ConnectError" for a in attempts)
    assert webhook_counts(runtime).get("exhausted", 0) == before + 1


def test_notify_twice_queues_one_delivery(runtime, worker, receiver: Receiver) -> None:
    path = receiver.path()
    job = new_job(runtime, receiver.url(path), status="expired")
    notify_status(runtime, job)
    notify_status(runtime, job)
    job.status = "running"  # type: ignore[assignment] - announces nothing
    notify_status(runtime, job)
    wait_for(lambda: finished(runtime, job.job_id))
    time.sleep(0.5)
    assert len(receiver.seen(path)) == 1
    (record,) = deliveries(runtime, job.job_id)
    assert record["event"] == "job.expired" and len(record["attempts"]) == 1


def test_awaiting_approval_is_announced_once_per_step(local_rt, receiver: Receiver) -> None:
    job = new_job(local_rt, receiver.url(receiver.path()), status="awaiting_approval")
    notify_status(local_rt, job)
    notify_status(local_rt, job)
    job.step = 1
    notify_status(local_rt, job)
    assert [r["slug"] for r in deliveries(local_rt, job.job_id)] == ["job.awaiting_approval@0", "job.awaiting_approval@1"]


def test_no_url_and_no_event_queue_nothing(local_rt) -> None:
    job = new_job(local_rt, "")
    job.webhook_url = None
    notify_status(local_rt, job)
    assert deliveries(local_rt, job.job_id) == []


def test_dns_answer_checked_again_at_delivery_and_the_checked_address_used(local_rt, receiver: Receiver) -> None:
    """A name that resolved to a public address at creation and to loopback at delivery (a DNS double: no DNS here)."""
    path = receiver.path()
    url = f"http://hooks.example:{receiver.port}{path}"
    assert validate_webhook_url(url, allow_private=False, resolve=lambda host, port: ["93.184.216.34"]) == url
    job = new_job(local_rt, url)
    notify_status(local_rt, job)
    to_loopback = lambda host, port: ["127.0.0.1"]  # noqa: E731 - the rebinding answer
    refused = dataclasses.replace(local_rt, settings=local_rt.settings.model_copy(update={"webhook_allow_private": False}))
    assert attempt_delivery(refused, job.job_id, "job.succeeded", resolve=to_loopback).outcome == "rejected"
    (record,) = deliveries(local_rt, job.job_id)
    assert record["state"] == "failed" and record["attempts"][0]["error"]["type"] == "webhook_url_not_allowed"
    assert receiver.seen(path) == []
    # allowed: the attempt connects to the address it checked and keeps the URL's host in Host
    job2 = new_job(local_rt, url)
    notify_status(local_rt, job2)
    allowed = dataclasses.replace(local_rt, settings=local_rt.settings.model_copy(update={"webhook_allow_private": True}))
    assert attempt_delivery(allowed, job2.job_id, "job.succeeded", resolve=to_loopback).outcome == "delivered"
    (request,) = receiver.seen(path)
    assert request["headers"]["host"] == f"hooks.example:{receiver.port}"


def test_slow_receiver_is_a_timeout_and_retried(local_rt, receiver: Receiver) -> None:
    path = receiver.path(delay_s=1.5)
    job = new_job(local_rt, receiver.url(path))
    notify_status(local_rt, job)
    quick = dataclasses.replace(local_rt, settings=local_rt.settings.model_copy(update={"webhook_timeout_s": 0.3}))
    started = time.monotonic()
    result = attempt_delivery(quick, job.job_id, "job.succeeded")
    assert time.monotonic() - started < 1.2
    assert result.outcome == "retry" and result.retry_in_s is not None and result.retry_in_s > 0
    (record,) = deliveries(local_rt, job.job_id)
    assert record["state"] == "pending" and record["attempts"][0]["error"]["type"] == "timeout"


def test_429_is_retried_no_sooner_than_retry_after_and_no_later_than_the_cap(local_rt, receiver: Receiver) -> None:
    job = new_job(local_rt, receiver.url(receiver.path([429, 429])))
    notify_status(local_rt, job)
    assert attempt_delivery(local_rt, job.job_id, "job.succeeded").retry_in_s == pytest.approx(7, abs=0.01)
    capped = dataclasses.replace(local_rt, settings=local_rt.settings.model_copy(update={"webhook_backoff_max_s": 2.0}))
    assert attempt_delivery(capped, job.job_id, "job.succeeded").retry_in_s == 2.0
    assert [a["status"] for a in deliveries(local_rt, job.job_id)[0]["attempts"]] == [429, 429]


@pytest.mark.parametrize("status", [404, 302])
def test_4xx_and_redirects_end_the_delivery(local_rt, receiver: Receiver, status: int) -> None:
    path = receiver.path([status])
    job = new_job(local_rt, receiver.url(path))
    notify_status(local_rt, job)
    assert attempt_delivery(local_rt, job.job_id, "job.succeeded").outcome == "rejected"
    (record,) = deliveries(local_rt, job.job_id)
    assert record["state"] == "failed" and record["attempts"][0]["status"] == status
    assert len(receiver.seen(path)) == 1  # the redirect was not followed
    assert attempt_delivery(local_rt, job.job_id, "job.succeeded").outcome == "done"  # ended: no more attempts


def test_a_tenant_without_secret_gets_nothing_unsigned(local_rt, receiver: Receiver) -> None:
    path = receiver.path()
    job = new_job(local_rt, receiver.url(path))
    job.tenant = "acme"
    notify_status(local_rt, job)
    (record,) = deliveries(local_rt, job.job_id)
    assert record["state"] == "failed" and record["outcome"] == "not_sent" and "acme" in record["reason"]
    assert receiver.seen(path) == []


def test_tenant_secret_and_default_url_from_settings(local_rt, receiver: Receiver) -> None:
    path = receiver.path()
    secret = "whsec_" + base64.b64encode(b"acme-key-0123456789abcdef").decode()
    settings = local_rt.settings.model_copy(update={"webhook_secrets": f"other:{WEBHOOK_SECRET},acme:{secret}",
                                                    "webhook_urls": {"acme": receiver.url(path)}})
    rt = dataclasses.replace(local_rt, settings=settings)
    job = new_job(rt, "")
    job.webhook_url, job.tenant = None, "acme"
    notify_status(rt, job)
    assert attempt_delivery(rt, job.job_id, "job.succeeded").outcome == "delivered"
    (request,) = receiver.seen(path)
    assert spec_signature_ok(secret, request["headers"], request["body"])
    assert not spec_signature_ok(WEBHOOK_SECRET, request["headers"], request["body"])


def test_a_job_with_a_webhook_url_announces_its_end_through_the_api(client, receiver: Receiver) -> None:
    path = receiver.path()
    created = client.post("/v1/jobs", json={"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing",
                                                                                                 "date": "today"}}],
                                            "webhook_url": receiver.url(path)})
    assert created.status_code == 202, created.text
    job = wait_terminal(client, created.json()["job_id"])
    assert job["status"] == "succeeded", job
    (request,) = wait_for(lambda: receiver.seen(path))
    assert spec_signature_ok(WEBHOOK_SECRET, request["headers"], request["body"])
    payload = json.loads(request["body"])
    assert payload["type"] == "job.succeeded" and payload["data"]["job_id"] == job["job_id"]
    assert payload["data"]["status"] == "succeeded"
    assert payload["data"]["calls"][0]["result"] == job["calls"][0]["result"]


def test_a_refused_webhook_url_is_a_422_and_makes_no_job(client) -> None:
    response = client.post("/v1/jobs", json={"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing",
                                                                                                  "date": "today"}}],
                                             "webhook_url": "ftp://example.com/hook"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "webhook_url_not_allowed"


def self_signed(tmp_path, name: str) -> tuple[str, str]:
    cert, key = str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
                    "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}"], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make a certificate")
def test_https_connects_to_the_checked_address_and_checks_the_certificate_against_the_host(local_rt, tmp_path) -> None:
    """TLS to the pinned address: SNI and the certificate check use the URL's host (a DNS double names the address)."""
    cert, key = self_signed(tmp_path, "hooks.test")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    tls_receiver = Receiver(tls=server_tls)
    try:
        path = tls_receiver.path()
        allowed = dataclasses.replace(local_rt, settings=local_rt.settings.model_copy(update={"webhook_allow_private": True}))
        to_loopback = resolves_to("127.0.0.1")
        job = new_job(local_rt, f"https://hooks.test:{tls_receiver.port}{path}")
        notify_status(local_rt, job)
        trusting = ssl.create_default_context(cafile=cert)
        assert attempt_delivery(allowed, job.job_id, "job.succeeded", resolve=to_loopback,
                                tls_verify=trusting).outcome == "delivered"
        (request,) = tls_receiver.seen(path)
        assert request["headers"]["host"] == f"hooks.test:{tls_receiver.port}"
        assert spec_signature_ok(WEBHOOK_SECRET, request["headers"], request["body"])
        # the same receiver under another name: its certificate does not match, nothing is sent
        other_cert, _ = self_signed(tmp_path, "other.test")
        job2 = new_job(local_rt, f"https://other.test:{tls_receiver.port}{path}")
        notify_status(local_rt, job2)
        result = attempt_delivery(allowed, job2.job_id, "job.succeeded", resolve=to_loopback,
                                  tls_verify=ssl.create_default_context(cafile=other_cert))
        assert result.outcome == "retry"
        (record,) = deliveries(local_rt, job2.job_id)
        assert record["attempts"][0]["error"]["type"] == "ConnectError"
        assert "certificate" in record["attempts"][0]["error"]["message"].lower()
        assert len(tls_receiver.seen(path)) == 1
    finally:
        tls_receiver.close()


# ----------------------------------------------------------------- URL validation and signatures, no worker


def resolves_to(*addresses: str):
    return lambda host, port: list(addresses)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/h", "http://[::1]/h", "http://10.1.2.3/h", "http://172.16.0.1/h", "http://172.31.255.255/h",
    "http://192.168.1.1/h", "http://169.254.169.254/latest/meta-data", "http://[fd00::1]/h", "http://localhost:8080/h",
    "http://0.0.0.0/h", "http://100.64.0.1/h", "http://[::ffff:127.0.0.1]/h", "http://2130706433/h", "http://0x7f.1/h",
])
def test_private_addresses_refused_unless_allowed(url: str) -> None:
    with pytest.raises(WebhookUrlError) as info:
        validate_webhook_url(url, allow_private=False)
    assert info.value.type == "webhook_url_not_allowed"
    assert validate_webhook_url(url, allow_private=True)


@pytest.mark.parametrize("url", ["ftp://example.com/h", "file:///etc/passwd", "gopher://127.0.0.1/", "javascript:alert(1)",
                                 "http://user:pw@93.184.216.34/h", "http:///nohost", "", "http://a b.example/",
                                 "http://example.com/" + "x" * 3000])
def test_bad_urls_refused_even_when_private_allowed(url: str) -> None:
    with pytest.raises(WebhookUrlError):
        validate_webhook_url(url, allow_private=True, resolve=resolves_to("93.184.216.34"))


def test_a_name_is_checked_on_every_address_it_resolves_to() -> None:
    """DNS doubles: a public name cannot be resolved here (no network)."""
    assert validate_webhook_url("https://Hooks.Example.com/in#frag", allow_private=False,
                                resolve=resolves_to("93.184.216.34", "2606:2800:220:1::1")) == "https://hooks.example.com/in"
    with pytest.raises(WebhookUrlError, match="10.0.0.7"):
        validate_webhook_url("https://hooks.example.com/in", allow_private=False,
                             resolve=resolves_to("93.184.216.34", "10.0.0.7"))
    with pytest.raises(WebhookUrlError, match="does not resolve"):
        validate_webhook_url("https://no-such-host.invalid/in", allow_private=False)


def test_sign_matches_the_spec_example_and_verify_checks_time_and_alternatives() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks example
    body = b'{"test": 2432232314}'
    signature = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330",
               "webhook-signature": f"v1,bm90LXRoaXMtb25l {signature}"}
    assert verify(secret, headers, body, now=1614265330 + 10)
    assert not verify(secret, headers, body)  # five years late: outside the replay window
    assert not verify(secret, headers, body + b"x", now=1614265330)
    assert not verify(secret, {**headers, "webhook-signature": "v2," + signature[3:]}, body, now=1614265330)
