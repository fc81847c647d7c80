"""Celery settings, in one place, consistent with each other.

The invariants (REFERENCE: Celery and Redis):
- late acks + reject on worker lost: a call whose worker dies is redelivered, and every
  task here is idempotent (job records, idempotency records) so running twice is safe;
- ``visibility_timeout`` exceeds the hard time limit of every task, so a message is
  never redelivered while its task may still be running;
- prefetch 1: a long tool call does not hold other messages hostage.

A ``redis://`` broker goes through ``executor.worker.broker``'s transport: kombu's, with one Redis client
per channel instead of one built for every publish and ack.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["DECIDER_WARM_KEY", "DECIDE_QUEUE", "DEFAULT_TASK_TIME_LIMIT_S", "TOOL_CHECK_EXIT", "WEBHOOK_QUEUE",
           "celery_config", "task_time_limit_for", "worker_queues"]

DECIDE_QUEUE = "decide"
WEBHOOK_QUEUE = "webhooks"
#: Set by a pool process of a deciding worker once its decider is loaded and warm (``executor.worker.celery``).
DECIDER_WARM_KEY = "tr:readiness:decider_warm"
#: Exit status of a worker that refuses to start because a tool module cannot run (EX_CONFIG).
TOOL_CHECK_EXIT = 78

DEFAULT_TASK_TIME_LIMIT_S = 600
DEFAULT_SOFT_TIME_LIMIT_S = 570


def worker_queues(registry: Any, *, extra: Iterable[str] = ()) -> list[str]:
    """Every queue a worker of this deployment consumes, each once: decide, webhooks, each tool's queue, then ``extra``
    (the registered MCP servers' queues, which only the assembly reads: ``executor.stack.deployment_queues``).

    The one list: ``toolrail serve``, ``toolrail worker``, the local stack and the tests' workers all start from it
    (a queue left out is work nobody takes: webhooks under ``serve`` were never delivered)."""
    return list(dict.fromkeys([DECIDE_QUEUE, WEBHOOK_QUEUE, *registry.queues(), *extra]))


def task_time_limit_for(visibility_timeout_s: int) -> int:
    """The hard task time limit that fits under a visibility timeout: 80 % of it, at most the default."""
    return max(1, min(DEFAULT_TASK_TIME_LIMIT_S, int(visibility_timeout_s * 0.8)))


def celery_config(redis_url: str, *, visibility_timeout_s: int = 3600, task_time_limit_s: int | None = None) -> dict[str, Any]:
    """The Celery configuration for a broker at ``redis_url``.

    ``task_time_limit_s`` defaults to ``task_time_limit_for(visibility_timeout_s)``, so a short
    visibility timeout (fast redelivery after a worker dies) brings the time limit down with it.
    """
    if task_time_limit_s is None:
        task_time_limit_s = task_time_limit_for(visibility_timeout_s)
    if visibility_timeout_s <= task_time_limit_s:
        raise ValueError(f"visibility_timeout ({visibility_timeout_s}s) must exceed the task time limit ({task_time_limit_s}s), "
                         "or running tasks get redelivered")
    # kombu sweeps for expired unacked messages every interval × throttle seconds (100 s by
    # default): sweep at least every 10 s, sooner for short visibility timeouts
    transport = {"visibility_timeout": visibility_timeout_s, "socket_timeout": 10, "socket_connect_timeout": 5,
                 "retry_on_timeout": True, "health_check_interval": 10,
                 "unacked_restore_interval": max(1, min(10, visibility_timeout_s // 10)), "unacked_restore_throttle": 1}
    return {
        "broker_url": redis_url,
        "broker_transport": "executor.worker.broker:Transport" if redis_url.startswith("redis://") else None,
        "broker_transport_options": transport,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "task_time_limit": task_time_limit_s,
        "task_soft_time_limit": max(1, min(DEFAULT_SOFT_TIME_LIMIT_S, task_time_limit_s - max(1, min(10, task_time_limit_s // 10)))),
        "task_default_queue": "decide",
        "task_create_missing_queues": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "enable_utc": True,
    }
