"""Agent-run benchmark: the server-side loop against a client loop of single-round jobs, side by side.

A 3-step run (call → call → answer) with a fast tool (``get_weather``, sandboxed) and a scripted
decider (``TOOLRAIL_DECIDER=custom``, the test double of tests/executor/scripted_decider.py: the
decisions themselves cost about nothing, so what is measured is the platform):

- ``server-loop``  one ``POST /v1/jobs``; the platform decides, runs, feeds results back, decides again
- ``client-loop``  the same three decisions as three single-round jobs (``max_steps: 1``): the client
                   appends the assistant turn and the tool results itself and submits the next job

Per run: wall time (submit → terminal state), and for the server loop the **platform overhead per
step** = step wall time (the step's start to the next step's start, or to the end) − its decision
time − its slowest tool's run time, all read from the job record. At 1 and 16 concurrent runs,
medians and p99 over ``--runs`` runs per level, both modes interleaved in one process on one stack.

Usage: ``python bench/runs.py [--runs 40] [--concurrency 1,16] [--out bench/results/runs.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# run as a script, bench/ is sys.path[0]: its modules must never shadow packages (bench/mcp.py vs the mcp SDK)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

CITIES = ["Beijing", "Paris", "Lima", "Oslo", "Rome", "Kyiv", "Cairo", "Quito"]


def _script(n: int) -> list[dict]:
    a, b = CITIES[n % len(CITIES)], CITIES[(n + 3) % len(CITIES)]
    return [{"calls": [{"name": "get_weather", "arguments": {"city": a, "date": "today"}}]},
            {"calls": [{"name": "get_weather", "arguments": {"city": b, "date": "today"}}]},
            {"text": "done"}]


def _user(n: int) -> dict:
    return {"role": "user", "content": "RUN " + json.dumps({"steps": _script(n)})}


def _wait(client, job_id: str, timeout_s: float = 120.0) -> dict:
    from executor.job_client import wait_for_job  # noqa: PLC0415

    return wait_for_job(client, job_id, timeout_s=timeout_s, poll_s=0.005)


def server_loop(client, n: int) -> dict:
    started = time.perf_counter()
    job_id = client.post("/v1/jobs", json={"messages": [_user(n)], "tools": ["get_weather"]}).json()["job_id"]
    job = _wait(client, job_id)
    wall = time.perf_counter() - started
    assert job["status"] == "succeeded", json.dumps(job)[:2000]
    overheads = []
    steps = job["steps"]
    for i, step in enumerate(steps):
        end = steps[i + 1]["started_at"] if i + 1 < len(steps) else job["updated_at"]
        decision = (step["decided_at"] or step["started_at"]) - step["started_at"]
        tools = max((c["duration_s"] or 0.0 for c in step["calls"]), default=0.0)
        overheads.append((end - step["started_at"]) - decision - tools)
    return {"wall": wall, "overheads": overheads, "steps": len(steps)}


def client_loop(client, n: int) -> dict:
    started = time.perf_counter()
    messages = [_user(n)]
    for _ in range(3):
        job_id = client.post("/v1/jobs", json={"messages": messages, "tools": ["get_weather"], "max_steps": 1}).json()["job_id"]
        job = _wait(client, job_id)
        assert job["status"] == "succeeded", json.dumps(job)[:2000]
        if not job["calls"]:
            break
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in job["calls"]]},
            *({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(c["result"])} for c in job["calls"])]
    return {"wall": time.perf_counter() - started}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _level(url: str, mode, runs: int, concurrency: int) -> list[dict]:
    import httpx  # noqa: PLC0415

    with httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda n: mode(client, n), range(runs)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per mode and level")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated concurrent runs")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "runs.md"))
    args = parser.parse_args(argv)
    os.environ.setdefault("TOOLRAIL_LOG_LEVEL", "WARNING")
    from executor.stack import LocalStack  # noqa: PLC0415

    env = {"TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": "tests.executor.scripted_decider:make",
           "TOOLRAIL_LOG_LEVEL": "WARNING", "TOOLRAIL_RUN_MAX_IDENTICAL_CALLS": "100"}
    os.environ.update({"TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": "tests.executor.scripted_decider:make"})
    rows = []
    with LocalStack(concurrency=args.workers, worker_env=env) as stack:
        _level(stack.url, server_loop, 4, 2)  # warm the sandboxes and the connection pools
        _level(stack.url, client_loop, 4, 2)
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            server = _level(stack.url, server_loop, args.runs, concurrency)
            client = _level(stack.url, client_loop, args.runs, concurrency)
            overheads = [o * 1000 for r in server for o in r["overheads"]]
            rows.append({"concurrency": concurrency,
                         "server_p50": statistics.median(r["wall"] for r in server) * 1000,
                         "server_p99": _pct([r["wall"] for r in server], 0.99) * 1000,
                         "client_p50": statistics.median(r["wall"] for r in client) * 1000,
                         "client_p99": _pct([r["wall"] for r in client], 0.99) * 1000,
                         "overhead_p50": statistics.median(overheads), "overhead_p99": _pct(overheads, 0.99)})
            print(json.dumps(rows[-1]), flush=True)
    load = os.getloadavg()
    lines = ["# Agent runs: server-side loop vs a client loop of single-round jobs", "",
             f"`python bench/runs.py --runs {args.runs} --concurrency {args.concurrency} --workers {args.workers}` — "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
             f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the end (shared machine: read ratios, not seconds).", "",
             "A run: call → call → answer (`get_weather`, sandboxed; a scripted decider, so decisions cost ~0).", "",
             "| concurrent runs | server loop p50 / p99 (ms) | client loop p50 / p99 (ms) | server ÷ client (p50) "
             "| overhead per step p50 / p99 (ms) |", "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['concurrency']} | {row['server_p50']:.0f} / {row['server_p99']:.0f} | {row['client_p50']:.0f} / "
                     f"{row['client_p99']:.0f} | {row['server_p50'] / row['client_p50']:.2f}× | {row['overhead_p50']:.1f} / "
                     f"{row['overhead_p99']:.1f} |")
    lines += ["", "Overhead per step = the step's wall time − its decision time − its slowest tool's run time, from "
              "the job record (queueing, the step's Redis writes, dispatch, the next decision's task hop)."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
