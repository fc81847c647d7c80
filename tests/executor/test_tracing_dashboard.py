"""The Grafana dashboard beside terraform reads only metrics the real API exports, and queue age is one of them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import redis

DASHBOARD = Path(__file__).resolve().parents[2] / "terraform/modules/observability/dashboards/toolrail.json"
METRICS_DB = 8


def _exported(text: str) -> set[str]:
    """Every sample name the scrape can carry, from its ``# TYPE`` lines (families without samples included)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count", "_created"],
                        "summary": ["_sum", "_count", "_created"]}.get(kind, [""])
            names.update(name + suffix for suffix in suffixes)
            names.add(name)
    return names


def test_every_dashboard_metric_is_exported_and_queue_age_is_measured(redis_url: str) -> None:
    from celery import Celery

    from executor.api.app import create_app
    from executor.worker.config import celery_config
    from executor.runtime import Runtime
    from tests.harness.serving import api_server
    from toolrail.settings import get_settings

    url = redis_url.rsplit("/", 1)[0] + f"/{METRICS_DB}"
    redis.Redis.from_url(url).flushdb()
    runtime = Runtime.from_settings(get_settings(), redis_url=url)
    publisher = Celery("toolrail-dashboard-test")
    publisher.conf.update(celery_config(url))
    publisher.send_task("toolrail.noop", args=["waits"], queue="decide")  # no worker listens on this database
    with api_server(create_app(get_settings(), runtime, enqueue=lambda job: None,
                               ping_workers=lambda: 1, mount_openai=False)) as base:
        time.sleep(0.3)
        scrape = httpx.get(f"{base}/metrics", timeout=10).text

    dashboard = json.loads(DASHBOARD.read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\btoolrail_[a-z_]+", target["expr"])}
    assert used, "the dashboard reads no toolrail metric"
    missing = sorted(used - _exported(scrape))
    assert not missing, f"dashboard metrics the API does not export: {missing}"
    ages = dict(re.findall(r'^toolrail_queue_oldest_age_seconds\{queue="([^"]+)"\} ([0-9.e+-]+)$', scrape, re.M))
    assert 0.25 <= float(ages["decide"]) < 60, ages
    depth = dict(re.findall(r'^toolrail_queue_depth\{queue="([^"]+)"\} ([0-9.e+-]+)$', scrape, re.M))
    assert float(depth["decide"]) == 1.0
