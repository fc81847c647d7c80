"""The Celery app (``celery -A executor.celery worker`` works) and the correlation signals.

The request id travels in a message header of our own (``toolrail_request_id``), set on
publish from the current context and bound to the logging context before each task —
never Celery's ``correlation_id``, which is the task id.
"""

from __future__ import annotations

import os

import structlog
from celery import Celery
from celery.signals import before_task_publish, task_postrun, task_prerun, worker_process_init

from executor.config import celery_config
from toolrail.context import CELERY_REQUEST_ID_HEADER, bind_request, current_request_id
from toolrail.logging import configure_logging
from toolrail.settings import get_settings

__all__ = ["app"]

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"


def _broker_url() -> str:
    return get_settings().redis_url or os.environ.get("REDIS_URL") or DEFAULT_BROKER


app = Celery("toolrail", include=["executor.tasks"])
app.conf.update(celery_config(_broker_url(), visibility_timeout_s=get_settings().visibility_timeout_s,
                              task_time_limit_s=getattr(get_settings(), "task_time_limit_s", None)))


@before_task_publish.connect
def _stamp_request_id(headers: dict | None = None, **_: object) -> None:
    if headers is not None and CELERY_REQUEST_ID_HEADER not in headers:
        request_id = current_request_id()
        if request_id:
            headers[CELERY_REQUEST_ID_HEADER] = request_id


@task_prerun.connect
def _bind_request_id(task=None, task_id: str | None = None, **_: object) -> None:
    request = getattr(task, "request", None)
    request_id = getattr(request, CELERY_REQUEST_ID_HEADER, None) if request is not None else None
    if request_id is None and request is not None:
        request_id = (getattr(request, "headers", None) or {}).get(CELERY_REQUEST_ID_HEADER)
    bind_request(request_id or "unknown", task=getattr(task, "name", None), task_id=task_id)


@task_postrun.connect
def _clear_request_id(**_: object) -> None:
    structlog.contextvars.clear_contextvars()


@worker_process_init.connect
def _configure_child_logging(**_: object) -> None:
    configure_logging(force=True)
