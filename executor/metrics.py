"""Outcome metrics of jobs, calls and decisions, shared by every process through Redis.

Jobs end and calls finish in whichever worker ran them, on any host; a per-process Prometheus
registry would only see its own share. So the process that records an outcome (the job store,
at the one transition that makes a job terminal or a call final) adds it to one Redis hash, in
the same transaction where it can, and the API exports the totals at scrape time
(:class:`OutcomeCollector`):

    toolrail_jobs_finished_total{status}          jobs by terminal status
    toolrail_calls_total{tool, outcome}           calls by tool and outcome (succeeded, failed, validated)
    toolrail_call_duration_seconds{tool}          histogram of tool run time
    toolrail_decisions_total{outcome}             decisions by what came of them (running, succeeded,
                                                  needs_review, failed, cancelled)
    toolrail_decision_duration_seconds            histogram: time in deciding/validating
    toolrail_reasks_total                         re-asks made (attempts after the first)
    toolrail_webhook_deliveries_total{outcome}    webhook deliveries by how they ended (delivered, rejected,
                                                  exhausted, not_sent)
    toolrail_run_guard_trips_total{guard}         agent runs stopped by a guard
    toolrail_run_steps_total                      run steps begun after tool results

Label values are bounded: statuses are enums, and ``tool`` is a registered tool's name for
calls that ran; calls of tools without an entrypoint (inline tools) are only validated and
count as ``tool="(not run)"``.

Who sees which labels (:class:`PublicView`): without the metrics key, a scrape of an API with
keys names no tenant (the ``tenant`` label is summed away) and none of a tenant's private tools:
``tool`` and ``queue`` values that are not the deployment's own (a tenant's MCP tools, its
``mcp.<tenant>.<server>`` queues) are summed into ``mcp``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import redis
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

__all__ = ["CALL_BUCKETS", "DECISION_BUCKETS", "MULTIPROCESS_DIR_ENV", "NOT_RUN_TOOL", "OutcomeCollector", "PRIVATE_TOOL",
           "PublicView", "metrics_key", "record_call", "record_decision", "record_guard", "record_job_finished",
           "record_step", "record_webhook"]

#: prometheus_client's multiprocess directory. Set (by ``toolrail serve --api-workers N``) before any API
#: process imports prometheus_client, each process keeps its own counters and histograms in files there
#: and every scrape sums them, whichever process answers it.
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

CALL_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DECISION_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
NOT_RUN_TOOL = "(not run)"
#: The ``tool`` (and ``queue``) label value of a tenant's private tools on the public scrape.
PRIVATE_TOOL = "mcp"
_SEP = "\x1f"  # unit separator: never part of a status or a tool name


def metrics_key(prefix: str = "tr") -> str:
    return f"{prefix}:metrics"


def _bucket(value: float, bounds: Sequence[float]) -> str:
    for bound in bounds:
        if value <= bound:
            return repr(bound)
    return "+Inf"


def _observe(pipe: Any, key: str, name: str, labels: Sequence[str], value: float, bounds: Sequence[float]) -> None:
    base = _SEP.join([name, *labels])
    pipe.hincrby(key, f"{base}{_SEP}le{_SEP}{_bucket(value, bounds)}", 1)
    pipe.hincrbyfloat(key, f"{base}{_SEP}sum", float(value))


def record_job_finished(pipe: Any, key: str, status: str) -> None:
    """Count a job that just reached ``status`` (call inside the transaction that sets it)."""
    pipe.hincrby(key, _SEP.join(["jobs", status]), 1)


def record_decision(pipe: Any, key: str, *, outcome: str, seconds: float | None, reasks: int) -> None:
    """Count a decision that just ended with the job moving to ``outcome``."""
    pipe.hincrby(key, _SEP.join(["decisions", outcome]), 1)
    if reasks > 0:
        pipe.hincrby(key, "reasks", reasks)
    if seconds is not None and math.isfinite(seconds) and seconds >= 0:
        _observe(pipe, key, "decision_s", [], seconds, DECISION_BUCKETS)


def record_call(pipe: Any, key: str, *, tool: str, outcome: str, seconds: float | None) -> None:
    """Count a call that just became final; ``tool`` must be a registered name (or :data:`NOT_RUN_TOOL`)."""
    pipe.hincrby(key, _SEP.join(["calls", tool, outcome]), 1)
    if seconds is not None and math.isfinite(seconds) and seconds >= 0:
        _observe(pipe, key, "call_s", [tool], seconds, CALL_BUCKETS)


def record_webhook(pipe: Any, key: str, *, outcome: str) -> None:
    """Count a webhook delivery that just ended (``delivered``, ``rejected``, ``exhausted``, ``not_sent``)."""
    pipe.hincrby(key, _SEP.join(["webhooks", outcome]), 1)


def record_guard(pipe: Any, key: str, guard: str) -> None:
    """Count a run stopped by a guard (``identical_calls``, ``run_calls``, ``tool_calls``, ``deadline``, ``max_steps``)."""
    pipe.hincrby(key, _SEP.join(["guards", guard]), 1)


def record_step(pipe: Any, key: str) -> None:
    """Count a run step that began (a decision after tool results)."""
    pipe.hincrby(key, "steps", 1)


class OutcomeCollector:
    """Prometheus collector: the totals in Redis, read at scrape time (nothing when Redis is down)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "tr") -> None:
        self._redis = client
        self._key = metrics_key(prefix)

    def collect(self) -> Iterator[Any]:
        jobs = CounterMetricFamily("toolrail_jobs_finished", "Jobs by terminal status", labels=["status"])
        calls = CounterMetricFamily("toolrail_calls", "Calls by tool and outcome", labels=["tool", "outcome"])
        decisions = CounterMetricFamily("toolrail_decisions", "Decisions by the status they moved the job to",
                                        labels=["outcome"])
        reasks = CounterMetricFamily("toolrail_reasks", "Re-asks made (attempts after the first)")
        webhooks = CounterMetricFamily("toolrail_webhook_deliveries", "Webhook deliveries by how they ended",
                                       labels=["outcome"])
        guards = CounterMetricFamily("toolrail_run_guard_trips", "Runs stopped by a guard", labels=["guard"])
        steps = CounterMetricFamily("toolrail_run_steps", "Run steps begun after tool results (decisions after the first)")
        call_s = HistogramMetricFamily("toolrail_call_duration_seconds", "Tool run time per tool", labels=["tool"])
        decision_s = HistogramMetricFamily("toolrail_decision_duration_seconds", "Time a job spent deciding and checking")
        try:
            raw = self._redis.hgetall(self._key)
        except redis.RedisError:
            raw = {}
        histograms: dict[tuple[str, ...], dict[str, Any]] = {}
        reask_total = step_total = 0
        for field_b, value_b in raw.items():
            parts = field_b.decode().split(_SEP)
            value = value_b.decode()
            if parts[0] == "jobs" and len(parts) == 2:
                jobs.add_metric([parts[1]], int(value))
            elif parts[0] == "calls" and len(parts) == 3:
                calls.add_metric([parts[1], parts[2]], int(value))
            elif parts[0] == "decisions" and len(parts) == 2:
                decisions.add_metric([parts[1]], int(value))
            elif parts[0] == "reasks":
                reask_total = int(value)
            elif parts[0] == "webhooks" and len(parts) == 2:
                webhooks.add_metric([parts[1]], int(value))
            elif parts[0] == "guards" and len(parts) == 2:
                guards.add_metric([parts[1]], int(value))
            elif parts[0] == "steps":
                step_total = int(value)
            elif parts[0] in {"call_s", "decision_s"}:
                entry = histograms.setdefault(tuple(parts[:-1] if parts[-1] == "sum" else parts[:-2]),
                                              {"buckets": {}, "sum": 0.0})
                if parts[-1] == "sum":
                    entry["sum"] = float(value)
                else:
                    entry["buckets"][parts[-1]] = int(value)
        reasks.add_metric([], reask_total)
        steps.add_metric([], step_total)
        for (name, *labels), entry in sorted(histograms.items()):
            bounds = CALL_BUCKETS if name == "call_s" else DECISION_BUCKETS
            cumulative, running = [], 0
            for bound in [*(repr(b) for b in bounds), "+Inf"]:
                running += entry["buckets"].get(bound, 0)
                cumulative.append((bound, running))
            (call_s if name == "call_s" else decision_s).add_metric(labels, cumulative, entry["sum"])
        yield webhooks
        yield from (jobs, calls, call_s, decisions, decision_s, reasks, guards, steps)


class PublicView:
    """A metrics registry as the public scrape shows it: ``tenant`` summed away (``drop_tenant``), and every
    ``tool``/``queue`` value outside ``public()`` (the deployment's own tool names and queues, read at each
    scrape) summed into :data:`PRIVATE_TOOL`: a tenant's MCP tools name its servers, its queues its tenant."""

    def __init__(self, registry: Any, *, public: Callable[[], tuple[Collection[str], Collection[str]]],
                 drop_tenant: bool) -> None:
        self._registry, self._public, self._drop_tenant = registry, public, drop_tenant

    def collect(self) -> Iterator[Any]:  # prometheus collector protocol
        tools, queues = self._public()
        allowed = {"tool": set(tools) | {NOT_RUN_TOOL}, "queue": set(queues)}
        for family in self._registry.collect():
            if not any(self._changes(sample.labels, allowed) for sample in family.samples):
                yield family
                continue
            summed: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                labels = {k: (PRIVATE_TOOL if k in allowed and v not in allowed[k] else v)
                          for k, v in sample.labels.items() if not (self._drop_tenant and k == "tenant")}
                key = (sample.name, tuple(sorted(labels.items())))
                if sample.name.endswith("_created"):  # a creation time: the earliest, not a sum
                    summed[key] = min(summed.get(key, sample.value), sample.value)
                else:
                    summed[key] = summed.get(key, 0.0) + sample.value
            merged = Metric(family.name, family.documentation, family.type, family.unit)
            for (name, labels), value in summed.items():
                merged.add_sample(name, dict(labels), value)
            yield merged

    def _changes(self, labels: dict[str, str], allowed: dict[str, set[str]]) -> bool:
        return (self._drop_tenant and "tenant" in labels) or any(
            k in allowed and v not in allowed[k] for k, v in labels.items())
