"""Signed webhooks of job status changes (Standard Webhooks), delivered by a worker task.

A job that reaches ``succeeded``, ``failed``, ``needs_review``, ``awaiting_approval`` or
``expired`` is announced to its ``webhook_url`` (else its tenant's default URL, else nobody)
as ``POST {"type": "job.<status>", "timestamp": "<RFC 3339>", "data": <job.public()>}`` with
the headers ``webhook-id`` (stable across retries: receivers deduplicate on it),
``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256(key, id.timestamp.body)>``
where the key is the tenant's ``whsec_<base64>`` secret.

The run loop calls :func:`notify_status` after every status change; it only writes a delivery
record (``SET NX``: once per job and event, however often it is called) and publishes it through the
runtime's queues (``rt.queues.webhook``: the worker's ``toolrail.deliver_webhook`` task on the ``webhooks``
queue, which calls :func:`attempt_delivery`), and never raises. The task makes one
attempt per run: 2xx ends it (delivered); 5xx, 408, 429, timeouts and connection errors retry
with exponential backoff and jitter until ``webhook_max_attempts``; any other answer ends it
(rejected). Every attempt is appended to the delivery's list (:func:`deliveries` reads them).

SSRF (:mod:`toolrail.netguard`, the one guard MCP servers pass too): only http(s) URLs; every
address the host resolves to must be global unless ``TOOLRAIL_WEBHOOK_ALLOW_PRIVATE=1``. The check
runs when the job is created (:func:`validate_webhook_url`) and again before every attempt, and the
attempt connects to the
address that was checked (the ``Host`` header and TLS server name keep the URL's host), so a DNS
answer that changes between the check and the connection is never followed. Redirects are not
followed either. Keys (TTL of the job):

    tr:job:<id>:webhooks                   list of the job's delivery slugs, in creation order
    tr:job:<id>:webhook:<slug>             JSON of one delivery (id, event, url, state, body)
    tr:job:<id>:webhook:<slug>:attempts    list of JSON attempts (at, status or error, duration)
    tr:job:<id>:webhook:<slug>:final       set once when the delivery ends (the metric counts it once)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import random
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import httpx

from executor import metrics
from executor.calls.breaker import DEFAULT_TENANT
from executor.errors import WebhookUrlError
from executor.ports import Runtime
from executor.store.records import JobRecord
from toolrail import netguard
from toolrail.logging import get_logger
from toolrail.settings import Settings

__all__ = [
    "DeliveryResult",
    "EVENTS",
    "attempt_delivery",
    "deliveries",
    "event_for",
    "finish_delivery",
    "notify_status",
    "resolve_host",
    "secret_for",
    "sign",
    "url_for",
    "validate_webhook_url",
    "verify",
]

log = get_logger("toolrail.webhooks")

#: Job status → webhook event type; other statuses announce nothing.
EVENTS: dict[str, str] = {"succeeded": "job.succeeded", "failed": "job.failed", "needs_review": "job.needs_review",
                          "awaiting_approval": "job.awaiting_approval", "expired": "job.expired"}
#: How far a ``webhook-timestamp`` may be from now for :func:`verify` (the spec's replay window).
DEFAULT_TOLERANCE_S = 300
_SECRET_PREFIX = "whsec_"
_USER_AGENT = "toolrail-webhooks/1"

#: ``resolve(host, port) -> addresses``: the resolver the SSRF check uses (tests pass a double).
Resolver = netguard.Resolver
resolve_host = netguard.resolve_host


# ----------------------------------------------------------------- signatures (Standard Webhooks)


def _secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (a bare base64 secret is accepted too, as the spec's libraries do)."""
    raw = secret[len(_SECRET_PREFIX):] if secret.startswith(_SECRET_PREFIX) else secret
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("a webhook secret is whsec_ followed by base64") from exc
    if not key:
        raise ValueError("a webhook secret is whsec_ followed by base64 of a non-empty key")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` + base64 of HMAC-SHA256(key, ``{id}.{timestamp}.{body}``)."""
    digest = hmac.new(_secret_key(secret), f"{msg_id}.{int(timestamp)}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, tolerance_s: int = DEFAULT_TOLERANCE_S,
           now: float | None = None) -> bool:
    """True when one of the (space-separated) ``v1`` signatures matches and the timestamp is recent."""
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    msg_id, stamp, signatures = lower.get("webhook-id"), lower.get("webhook-timestamp"), lower.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        return False
    try:
        timestamp = int(stamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, msg_id, timestamp, body).encode()
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(f"v1,{value}".encode(), expected):
            return True
    return False


# ----------------------------------------------------------------- URLs (SSRF)


def _checked(url: str, *, allow_private: bool, resolve: Resolver) -> tuple[httpx.URL, list[str]]:
    """The parsed URL and its host's addresses (:mod:`toolrail.netguard`, the one SSRF guard), or ``WebhookUrlError``."""
    try:
        return netguard.check_url(url, allow_private=allow_private, resolve=resolve)
    except netguard.UrlRefusedError as exc:
        hint = " (TOOLRAIL_WEBHOOK_ALLOW_PRIVATE=1 allows it)" if exc.reason == "not_public" else ""
        raise WebhookUrlError(f"webhook: {exc}{hint}", **exc.details) from None


def validate_webhook_url(url: str, *, allow_private: bool, resolve: Resolver = resolve_host) -> str:
    """The normalized URL (scheme and host lowercased, no fragment), or ``WebhookUrlError``.

    http and https only, no credentials, and every address the host resolves to must be public
    unless ``allow_private``. Delivery checks again (DNS answers change).
    """
    parsed, _ = _checked(url, allow_private=allow_private, resolve=resolve)
    return str(parsed)


# ----------------------------------------------------------------- settings


def secret_for(settings: Settings, tenant: str) -> str | None:
    """The tenant's signing secret: ``webhook_secrets``, else ``webhook_secret`` for the default tenant."""
    for item in filter(None, (part.strip() for part in settings.webhook_secrets.split(","))):
        name, _, secret = item.partition(":")
        if name == tenant and secret:
            return secret
    return (settings.webhook_secret or None) if tenant == DEFAULT_TENANT else None


def url_for(settings: Settings, job: JobRecord) -> str | None:
    """Where the job's events go: its own ``webhook_url``, else its tenant's default, else nowhere."""
    return job.webhook_url or settings.webhook_urls.get(job.tenant) or None


def event_for(status: str) -> str | None:
    return EVENTS.get(status)


# ----------------------------------------------------------------- records


def _prefix(rt: Runtime, job_id: str) -> str:
    return rt.store.events_key(job_id).removesuffix(":events")


def _keys(rt: Runtime, job_id: str, slug: str) -> tuple[str, str, str]:
    base = f"{_prefix(rt, job_id)}:webhook:{slug}"
    return base, f"{base}:attempts", f"{base}:final"


def _metrics_key(rt: Runtime) -> str:
    return metrics.metrics_key(rt.store.events_key("x").split(":job:", 1)[0])


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _slug(job: JobRecord, event: str) -> str:
    """One delivery per (job, event); a job may wait for approval once per step, so that event is per step."""
    return f"{event}@{job.step}" if event == "job.awaiting_approval" else event


def _delivery_id(job_id: str, slug: str) -> str:
    return "msg_" + hashlib.sha256(f"{job_id}\x1f{slug}".encode()).hexdigest()[:32]


def notify_status(rt: Runtime, job: JobRecord) -> None:
    """Queue the webhook of the job's current status, once per (job, event); never raises, never waits on a receiver."""
    try:
        _notify(rt, job)
    except Exception as exc:  # noqa: BLE001 - a webhook must never fail or block the run
        log.error("webhook.notify_failed", job_id=job.job_id, status=job.status, error=f"{type(exc).__name__}: {exc}")


def _notify(rt: Runtime, job: JobRecord) -> None:
    event = event_for(job.status)
    url = url_for(rt.settings, job) if event else None
    if event is None or url is None:
        return
    slug = _slug(job, event)
    record_key, attempts_key, final_key = _keys(rt, job.job_id, slug)
    if not job.calls:  # the record ``store.update`` returns carries no calls (they live in a hash of their own)
        job = job.model_copy(update={"calls": rt.store.get(job.job_id).calls})
    body = json.dumps({"type": event, "timestamp": _rfc3339(job.updated_at), "data": job.public()},
                      ensure_ascii=False, separators=(",", ":"), default=str)
    record = {"id": _delivery_id(job.job_id, slug), "event": event, "slug": slug, "url": url, "tenant": job.tenant,
              "request_id": job.request_id, "created_at": time.time(), "state": "pending", "body": body}
    ttl = rt.settings.job_ttl_s
    if not rt.redis.set(record_key, json.dumps(record, ensure_ascii=False), nx=True, ex=ttl):
        log.info("webhook.already_queued", job_id=job.job_id, webhook_event=event, delivery_id=record["id"])
        return
    pipe = rt.redis.pipeline(transaction=False)
    pipe.rpush(f"{_prefix(rt, job.job_id)}:webhooks", slug)
    pipe.expire(f"{_prefix(rt, job.job_id)}:webhooks", ttl)
    pipe.execute()
    if secret_for(rt.settings, job.tenant) is None:
        finish_delivery(rt, job.job_id, slug, state="failed", outcome="not_sent",
                reason=f"no webhook signing secret is configured for tenant {job.tenant!r}")
        log.warning("webhook.no_secret", job_id=job.job_id, tenant=job.tenant, webhook_event=event)
        return
    try:
        if rt.queues is None:
            raise RuntimeError("this runtime has no queues to publish the delivery on")
        rt.queues.webhook(job, slug)
    except Exception:
        rt.redis.delete(record_key, attempts_key, final_key)  # a later notify may queue it again
        rt.redis.lrem(f"{_prefix(rt, job.job_id)}:webhooks", 0, slug)
        raise
    log.info("webhook.queued", job_id=job.job_id, webhook_event=event, delivery_id=record["id"])


def _load(rt: Runtime, job_id: str, slug: str) -> dict[str, Any] | None:
    raw = rt.redis.get(_keys(rt, job_id, slug)[0])
    return json.loads(raw) if raw else None


def finish_delivery(rt: Runtime, job_id: str, slug: str, *, state: str, outcome: str, reason: str | None = None) -> None:
    """End a delivery once: its state on the record, and one count in ``toolrail_webhook_deliveries_total``."""
    record_key, _, final_key = _keys(rt, job_id, slug)
    if not rt.redis.set(final_key, outcome, nx=True, ex=rt.settings.job_ttl_s):
        return
    record = _load(rt, job_id, slug) or {}
    record.pop("body", None)  # no attempt follows: only the record stays
    record.update({"state": state, "outcome": outcome, "finished_at": time.time(),
                   **({"reason": reason} if reason else {})})
    pipe = rt.redis.pipeline()
    pipe.set(record_key, json.dumps(record, ensure_ascii=False), keepttl=True)
    metrics.record_webhook(pipe, _metrics_key(rt), outcome=outcome)
    pipe.execute()


def deliveries(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    """The job's webhook deliveries, oldest first: id, event, url, state, outcome and every attempt (no body)."""
    out = []
    for raw_slug in rt.redis.lrange(f"{_prefix(rt, job_id)}:webhooks", 0, -1):
        slug = raw_slug.decode()
        record = _load(rt, job_id, slug)
        if record is None:
            continue
        record.pop("body", None)
        record["attempts"] = [json.loads(a) for a in rt.redis.lrange(_keys(rt, job_id, slug)[1], 0, -1)]
        out.append(record)
    return out


# ----------------------------------------------------------------- one attempt


@dataclass(frozen=True)
class DeliveryResult:
    """What one attempt came to: ``delivered``, ``retry`` (in ``retry_in_s``), ``rejected``, ``exhausted``, ``done``."""

    outcome: str
    attempt: int = 0
    retry_in_s: float | None = None


def _backoff(settings: Settings, attempt: int, retry_after: float | None = None) -> float:
    """Exponential with jitter (0.5x to 1.5x), at most ``webhook_backoff_max_s``; a receiver's ``Retry-After`` honoured."""
    base = settings.webhook_backoff_s * (2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
    if retry_after is not None:
        base = max(base, retry_after)
    return round(min(base, settings.webhook_backoff_max_s), 3)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


async def _post(url: httpx.URL, address: str, headers: dict[str, str], body: bytes, timeout_s: float,
                tls_verify: ssl.SSLContext | bool = True) -> httpx.Response:
    """POST to ``address`` (the checked one) with the URL's host as ``Host`` and TLS server name; no redirects.

    The certificate is checked against the URL's host (the server name), never against the address.
    """
    target, host, extensions = netguard.pinned(url, address)
    headers = {**headers, **host}
    async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, trust_env=False, verify=tls_verify) as client:
        request = client.build_request("POST", target, headers=headers, content=body, extensions=extensions)
        response = await client.send(request, stream=True)
        await response.aclose()  # the status is all a webhook needs; the body is never read
        return response


def attempt_delivery(rt: Runtime, job_id: str, slug: str, *, settings: Settings | None = None,
                     resolve: Resolver = resolve_host, tls_verify: ssl.SSLContext | bool = True) -> DeliveryResult:
    """Make one attempt of a delivery and record it; says whether (and when) to try again.

    ``resolve`` and ``tls_verify`` (httpx's default CA bundle unless given) are for tests and private CAs.
    """
    settings = settings or rt.settings
    record = _load(rt, job_id, slug)
    if record is None or record.get("state") != "pending":
        return DeliveryResult("done")
    _, attempts_key, _ = _keys(rt, job_id, slug)
    attempt = int(rt.redis.llen(attempts_key)) + 1
    if attempt > settings.webhook_max_attempts:
        finish_delivery(rt, job_id, slug, state="failed", outcome="exhausted")
        return DeliveryResult("exhausted", attempt - 1)
    started, at = time.monotonic(), time.time()
    entry: dict[str, Any] = {"attempt": attempt, "at": _rfc3339(at)}
    retry_after: float | None = None
    try:
        url, addresses = _checked(record["url"], allow_private=settings.webhook_allow_private, resolve=resolve)
    except WebhookUrlError as exc:
        url, addresses = None, []
        transient = exc.details.get("reason") == "unresolved"  # DNS trouble may pass; a refused address does not
        entry.update(error={"type": "dns" if transient else exc.type, "message": str(exc)},
                     outcome="retry" if transient else "rejected")
    secret = secret_for(settings, record["tenant"])
    if url is not None and not secret:  # never sent unsigned (the secret may have been removed since it was queued)
        url = None
        entry.update(error={"type": "no_secret", "message": "no webhook signing secret for this tenant"},
                     outcome="rejected")
    if url is not None and secret:
        body = record["body"].encode()
        stamp = int(at)
        headers = {"content-type": "application/json", "user-agent": _USER_AGENT, "webhook-id": record["id"],
                   "webhook-timestamp": str(stamp), "webhook-signature": sign(secret, record["id"], stamp, body)}
        try:
            response = asyncio.run(asyncio.wait_for(_post(url, addresses[0], headers, body, settings.webhook_timeout_s,
                                                          tls_verify), timeout=settings.webhook_timeout_s))
        except (asyncio.TimeoutError, httpx.TimeoutException):
            entry.update(error={"type": "timeout", "message": f"no answer within {settings.webhook_timeout_s:g} s"},
                         outcome="retry")
        except httpx.HTTPError as exc:
            entry.update(error={"type": type(exc).__name__, "message": str(exc)[:500]}, outcome="retry")
        else:
            code = response.status_code
            entry["status"] = code
            if 200 <= code < 300:
                entry["outcome"] = "delivered"
            elif code >= 500 or code in (408, 429):
                entry["outcome"] = "retry"
                retry_after = _retry_after(response.headers.get("retry-after"))
            else:
                entry["outcome"] = "rejected"
    entry["duration_s"] = round(time.monotonic() - started, 6)
    pipe = rt.redis.pipeline(transaction=False)
    pipe.rpush(attempts_key, json.dumps(entry, ensure_ascii=False))
    pipe.expire(attempts_key, settings.job_ttl_s)
    pipe.execute()
    outcome = entry["outcome"]
    log.info("webhook.attempt", job_id=job_id, delivery_id=record["id"], webhook_event=record["event"], attempt=attempt,
             outcome=outcome, status=entry.get("status"), error_type=(entry.get("error") or {}).get("type"),
             duration_s=entry["duration_s"])
    if outcome == "delivered":
        finish_delivery(rt, job_id, slug, state="delivered", outcome="delivered")
        return DeliveryResult("delivered", attempt)
    if outcome == "rejected":
        finish_delivery(rt, job_id, slug, state="failed", outcome="rejected", reason=(entry.get("error") or {}).get("message")
                or f"the receiver answered {entry.get('status')}")
        return DeliveryResult("rejected", attempt)
    if attempt >= settings.webhook_max_attempts:
        finish_delivery(rt, job_id, slug, state="failed", outcome="exhausted",
                reason=f"no 2xx answer in {attempt} attempt(s)")
        log.warning("webhook.exhausted", job_id=job_id, delivery_id=record["id"], attempts=attempt)
        return DeliveryResult("exhausted", attempt)
    return DeliveryResult("retry", attempt, _backoff(settings, attempt, retry_after))
