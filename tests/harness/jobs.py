"""Helpers for tests that drive jobs through the real API."""

from __future__ import annotations

import httpx

__all__ = ["publishers", "wait_terminal"]


def wait_terminal(client: httpx.Client, job_id: str, timeout_s: float = 60.0) -> dict:
    """Poll a job until it reaches a terminal status."""
    from executor.job_client import wait_for_job
    from executor.store.records import TERMINAL_JOB

    job = wait_for_job(client, job_id, timeout_s=timeout_s)
    assert job["status"] in TERMINAL_JOB, f"job {job_id} not terminal after {timeout_s}s: {job}"
    return job


def publishers(db_url: str):  # noqa: ANN201 - (enqueue, rerun) as create_app takes them
    """``enqueue(job)`` and ``rerun(job, call)`` publishing on ``db_url``'s broker (the API's Celery app is bound to the
    session's), for ``create_app(enqueue=..., rerun=...)``."""
    from celery import Celery

    app = Celery(f"publisher-{db_url.rsplit('/', 1)[1]}", broker=db_url)

    def enqueue(job) -> None:  # noqa: ANN001
        app.send_task("toolrail.decide", args=[job.job_id], queue="decide")

    def rerun(job, call) -> None:  # noqa: ANN001
        app.send_task("toolrail.run_call", args=[job.job_id, call.id], queue=call.queue)

    return enqueue, rerun
