"""The Celery app (``celery -A executor.worker.celery worker`` works) and the correlation signals.

The request id travels in a message header of our own (``toolrail_request_id``), set on
publish from the current context and bound to the logging context before each task —
never Celery's ``correlation_id``, which is the task id.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import structlog
import celery.exceptions
from celery import Celery, Task
from celery.signals import (before_task_publish, celeryd_init, task_postrun, task_prerun, worker_init,
                            worker_process_init, worker_shutdown)

from executor.worker import liveness
from executor.worker.config import DECIDE_QUEUE, TOOL_CHECK_EXIT, celery_config
from executor.worker.tracing import instrument_celery
from toolrail.lifeline import die_with_parent
from toolrail.context import CELERY_REQUEST_ID_HEADER, bind_request, current_request_id
from toolrail.logging import configure_logging, get_logger
from toolrail.redis_embed import redis_url
from toolrail.settings import get_settings
from executor.sandbox.toolcheck import check_tools
from tools.registry import default_registry, demo_tools_from_settings, tool_modules_from_env
from executor.store.worker_tools import publish

__all__ = ["PREWARM_ENV", "WARM_DECIDER_ENV", "BoundaryTask", "app"]

log = get_logger("toolrail.worker")


class BoundaryTask(Task):
    """Every task's last word: a failure no retry will answer (a bug, retries exhausted) ends the task's work — its job,
    call or webhook delivery — with ``internal_error``, never stranded. ``given_up(task_name, args, exc)`` is what
    does it (``executor.worker.tasks`` sets it to ``executor.runs.submit.end_stranded``: imports run one way)."""

    given_up: Callable[[str, list[Any], BaseException], None] | None = None

    def on_failure(self, exc: BaseException, task_id: str, args: tuple, kwargs: dict, einfo: object) -> None:
        if BoundaryTask.given_up is not None:
            BoundaryTask.given_up(self.name, list(args or ()), exc)


app = Celery("toolrail", include=["executor.worker.tasks"], task_cls=BoundaryTask)
# REDIS_URL, never a default port: without it this import is RedisNotConfiguredError (one line from `toolrail worker`)
app.conf.update(celery_config(redis_url(get_settings()), visibility_timeout_s=get_settings().visibility_timeout_s,
                              task_time_limit_s=getattr(get_settings(), "task_time_limit_s", None)))


@celeryd_init.connect
def _accept_root(**_: object) -> None:
    """Celery's warning about a worker run as root, silenced (sent just before Celery's privilege check): the worker
    runs as root on purpose — each tool call gets a uid of its own (``executor.sandbox``) — and accepts JSON only
    (``celery_config``), never pickle, which is what the warning is about. Only that warning, only here."""
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges",
                            category=celery.exceptions.SecurityWarning)


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
    die_with_parent()  # a pool process never outlives its worker's main process, however that dies
    liveness.forget_holder()  # its main process takes and acks the messages
    configure_logging(force=True)
    instrument_celery("worker")  # tracing after the prefork fork: the batch processor's thread lives here


#: Set by the main process of a worker that runs tools: each pool process starts its sandbox at once
#: (``executor.worker.tasks`` warms it).
PREWARM_ENV = "TOOLRAIL_SANDBOX_PREWARM"
#: Set by the main process of a worker that decides: each pool process loads its decider at once.
WARM_DECIDER_ENV = "TOOLRAIL_DECIDER_PREWARM"


_heartbeat: liveness.Heartbeat | None = None


@worker_init.connect
def _start_heartbeat(**_: object) -> None:
    """This main process holds the messages it takes: it beats, so that they go back at once if it dies."""
    global _heartbeat
    import redis  # noqa: PLC0415

    _heartbeat = liveness.Heartbeat(redis.Redis.from_url(redis_url(get_settings()), socket_timeout=5,
                                                         socket_connect_timeout=5)).start()


@worker_shutdown.connect
def _stop_heartbeat(**_: object) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()


@worker_init.connect
def _check_tools(sender: object = None, **_: object) -> None:
    """Before any task: every tool module imports inside a real sandbox child, or the worker stops; the pool
    processes of a deciding worker are told to warm their decider."""
    queues = getattr(getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None), "consume_from", None)
    names = None if queues is None else {str(name) for name in queues}
    if (names is None or DECIDE_QUEUE in names) and get_settings().decider != "none":
        os.environ[WARM_DECIDER_ENV] = "1"  # inherited by the pool processes, forked after this
    if names is not None and names <= {DECIDE_QUEUE, "webhooks"}:
        return  # a decide/webhooks-only worker runs no tool

    configure_logging()
    report = check_tools(default_registry(), schemas=False)
    for finding in report.findings:
        log.error("tools.check_failed", **finding.to_dict())
    if report.fatal:
        lines = "\n".join(f"  {finding.message()}" for finding in report.fatal)
        print(f"toolrail worker: refusing to start, tool modules cannot run in the sandbox:\n{lines}",
              file=sys.stderr, flush=True)
        raise SystemExit(TOOL_CHECK_EXIT)
    log.info("tools.checked", tools=len(report.checked), refused=sorted(report.failed_tools()))
    _publish_tools(str(getattr(sender, "hostname", "") or ""), [name for name in default_registry().names()
                                                                 if name not in report.failed_tools()])
    os.environ[PREWARM_ENV] = "1"  # pool processes are forked after this: they inherit it


def _publish_tools(worker: str, tools: list[str]) -> None:
    """What this pool serves, in Redis (``executor.store.worker_tools``): a process started with an environment of its
    own (``toolrail mcp stdio`` from an MCP host) loads the same tools, or says which it cannot."""
    import redis  # noqa: PLC0415

    try:
        client = redis.Redis.from_url(redis_url(get_settings()), socket_connect_timeout=2, socket_timeout=5)
        try:
            publish(client, worker or f"pid{os.getpid()}", demo_tools=demo_tools_from_settings(),
                    modules=tool_modules_from_env(), tools=tools)
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - the pool serves its queues regardless; stdio will say what it lacks
        log.warning("tools.publish_failed", error=f"{type(exc).__name__}: {exc}")
