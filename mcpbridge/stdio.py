"""``toolrail mcp stdio``: the same handlers as ``/mcp`` on stdin/stdout for a local host (tenant ``default``),
over the running deployment's jobs (``executor.stack.deployment_jobs``: its Redis, its queues, the tools its
workers load). Logs go to stderr; stdout carries nothing but the protocol."""

from __future__ import annotations

import argparse
import os

from executor.stack import deployment_jobs
from mcpbridge.server import serve_stdio
from toolrail.settings import get_settings

__all__ = ["serve"]


def serve(args: argparse.Namespace) -> int:
    """Serve until the host closes stdin; ``--redis-url`` names the deployment's Redis (else ``REDIS_URL``)."""
    if args.redis_url:  # the job store and the Celery app publishing its tasks: one Redis (the app reads REDIS_URL)
        os.environ["REDIS_URL"] = args.redis_url
        get_settings.cache_clear()
    settings = get_settings()
    serve_stdio(deployment_jobs(settings), settings)
    return 0
