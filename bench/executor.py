"""Executor benchmark: the full pipeline against bare Celery, side by side in one run.

Rows, each at client concurrency 1, 16 and 64, on one Redis and one worker pool per stack:

- ``celery-noop``    publish a no-op task; the task signals completion in Redis (the floor)
- ``celery-fork``    the same task, forking a no-op child and waiting for it: the physical
                     reference of a sandboxed call (one process per call)
- ``api-validate``   POST /v1/jobs with an inline tool's call → validated, stored
- ``api-sandboxed``  POST /v1/jobs with a get_weather call → validated, run in a sandboxed
                     process, stored

With ``--compare ROOT`` (a checkout of other code, e.g. ``git worktree add /tmp/old <commit>``)
a second stack runs that code's API and workers on a Redis of its own, and its api-* rows are
interleaved with this tree's at every level: before and after, measured side by side.

Latency is submit → terminal state stored (waited on with a blocking read of the job's event
stream, so polling adds nothing). The api-* rows post over one keep-alive ``http.client`` connection
per client thread (``--http-client httpx``: the shared httpx client of earlier runs, whose own CPU
per job exceeded the API's at 64 clients). ``--repeat`` runs every level that many times, interleaved,
and reports medians. Redis work per job is counted at one client from the server's own
counters (``INFO stats``: commands processed, and read events — one per request batch a
client sends, i.e. round trips), the bench client's own reads and the idle background
(worker polls, heartbeats) subtracted. Usage:
``python bench/executor.py [--quick] [--workers 2] [--api-workers 1] [--repeat 3] [--compare /tmp/old]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from executor.stack import stop_process, wait_for_workers, wait_http_ok  # noqa: E402
from executor.store.records import TERMINAL_JOB  # noqa: E402
from toolrail.redis_embed import EmbeddedRedis, free_port  # noqa: E402

__all__ = ["INLINE_TOOL", "Stack", "celery_runners", "job_runners", "main", "percentile", "redis_work", "run_level",
           "start_stack"]

INLINE_TOOL = {"type": "function", "function": {"name": "echo_city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
#: Jobs per row at concurrency > 1 (scaled by --quick); the c=1 rows run a quarter of it.
ROW_SIZES = {"celery-noop": 400, "celery-fork": 300, "api-validate": 200, "api-sandboxed": 120}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_level(fn: Callable[[], bool], total: int, concurrency: int) -> dict:
    """Run ``fn`` ``total`` times from ``concurrency`` client threads: throughput and latency."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def one(_: int) -> None:
        nonlocal errors
        started = time.perf_counter()
        ok = fn()
        elapsed = time.perf_counter() - started
        with lock:
            if ok:
                latencies.append(elapsed)
            else:
                errors += 1

    wall = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(total)))
    wall = time.perf_counter() - wall
    return {"n": total, "errors": errors, "throughput": len(latencies) / wall if wall else 0.0,
            "p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
            "p99_ms": percentile(latencies, 0.99) * 1000 if latencies else float("nan")}


@dataclass
class Stack:
    """One toolrail (Redis, worker pool, API) running the code of ``root``."""

    label: str
    root: Path
    url: str
    base: str
    client: redis.Redis
    http: httpx.Client
    #: Process ids of the API and of the worker's main process (profilers attach to them).
    api_pid: int = 0
    worker_pid: int = 0
    #: XREAD/BLPOP calls the bench itself made (subtracted from the server's counters).
    own_reads: list[int] = field(default_factory=lambda: [0])


def _code_env(root: Path, url: str) -> dict[str, str]:
    # get_weather is a demo tool: registered only when named (TOOLRAIL_DEMO_TOOLS; older trees ignore it)
    return {**os.environ, "TOOLRAIL_DECIDER": "none", "TOOLRAIL_LOG_LEVEL": "WARNING", "REDIS_URL": url,
            "TOOLRAIL_DEMO_TOOLS": "get_weather",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


@contextmanager
def start_stack(label: str, root: Path, *, workers: int = 2, queues: tuple[str, ...] = ("decide", "tool.get_weather"),
                env: dict[str, str] | None = None, api_workers: int = 1) -> Iterator[Stack]:
    """Redis, a Celery worker pool and the API (``api_workers`` processes) of the code at ``root`` (``env`` over the
    bench's), stopped on exit."""
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(data_dir=Path(tmp) / "redis") as server:
        env = {**_code_env(root, server.url), **(env or {})}
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "executor.worker.celery", "worker", "-Q", ",".join(queues), "-c", str(workers),
             "--pool", "prefork", "-n", f"bench-{label}-{free_port()}@%h", "--without-gossip", "--without-mingle",
             "--loglevel", "WARNING"], cwd=root, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        port = free_port()
        api = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--no-worker", "--port", str(port),
                                *(["--api-workers", str(api_workers)] if api_workers > 1 else [])],
                               cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, limits=httpx.Limits(max_connections=128))
        try:
            wait_for_workers(server.url, timeout_s=180)
            wait_http_ok(f"http://127.0.0.1:{port}", timeout_s=120)
            yield Stack(label, root, server.url, f"http://127.0.0.1:{port}", redis.Redis.from_url(server.url), http,
                        api_pid=api.pid, worker_pid=worker.pid)
        finally:
            http.close()
            stop_process(api)
            stop_process(worker)


class _KeepAlivePoster:
    """POST JSON over one keep-alive ``http.client`` connection per client thread: the load generator's own CPU
    per request is about a third of httpx's (bench/results/executor.md), so it leaves the two cores to the stack."""

    def __init__(self, base: str) -> None:
        self._host, self._port = base.removeprefix("http://").rsplit(":", 1)
        self._local = threading.local()

    def __call__(self, path: str, body: dict) -> tuple[int, dict]:
        data = json.dumps(body).encode()
        try:
            return self._post(path, data)
        except (ConnectionError, http.client.HTTPException):  # the server closed it while idle: once more, anew
            return self._post(path, data)

    def _post(self, path: str, data: bytes) -> tuple[int, dict]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self._host, int(self._port), timeout=60)
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read())
        except (ConnectionError, http.client.HTTPException):
            conn.close()
            self._local.conn = None
            raise


class _HttpxPoster:
    """The same POST through the stack's shared ``httpx.Client`` (the load generator of earlier runs)."""

    def __init__(self, http: httpx.Client) -> None:
        self._http = http

    def __call__(self, path: str, body: dict) -> tuple[int, dict]:
        reply = self._http.post(path, json=body)
        return reply.status_code, reply.json()


def job_runners(stack: Stack, client: str = "stdlib") -> dict[str, Callable[[], bool]]:
    """The api-* rows of one stack: submit a job (``client``: ``stdlib`` or ``httpx``), wait for its terminal
    status event."""

    def wait_job(job_id: str) -> bool:
        key, last = f"tr:job:{job_id}:events", "0"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            stack.own_reads[0] += 1
            for _stream, entries in stack.client.xread({key: last}, block=5000) or []:
                for entry_id, fields in entries:
                    last = entry_id
                    data = json.loads(fields[b"data"])
                    if data.get("type") == "status" and data.get("status") in TERMINAL_JOB:
                        return data["status"] == "succeeded"
        return False

    post = _KeepAlivePoster(stack.base) if client == "stdlib" else _HttpxPoster(stack.http)

    def api_validate() -> bool:
        status, reply = post("/v1/jobs", {"tools": [INLINE_TOOL], "tool_calls": [{"name": "echo_city", "arguments": {"city": "Paris"}}]})
        return status == 202 and wait_job(reply["job_id"])

    def api_sandboxed() -> bool:
        status, reply = post("/v1/jobs", {"tools": ["get_weather"], "tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}]})
        return status == 202 and wait_job(reply["job_id"])

    return {"api-validate": api_validate, "api-sandboxed": api_sandboxed}


def celery_runners(stack: Stack) -> dict[str, Callable[[], bool]]:
    """The bare-Celery reference rows (the stack's worker must consume the ``bench`` queue)."""
    from executor.worker.tasks import fork_noop, noop  # noqa: PLC0415 - after REDIS_URL is set

    def run(task: Callable) -> Callable[[], bool]:
        def one() -> bool:
            token = uuid.uuid4().hex
            task.apply_async(args=[token], queue="bench")
            stack.own_reads[0] += 1
            return stack.client.blpop([f"bench:done:{token}"], timeout=60) is not None
        return one

    return {"celery-noop": run(noop), "celery-fork": run(fork_noop)}


def _counters(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("stats")
    return int(stats["total_commands_processed"]), int(stats["total_reads_processed"])


def _command_calls(client: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in client.info("commandstats").items()}


def redis_work(stack: Stack, fn: Callable[[], bool], jobs: int = 30) -> dict:
    """Redis commands and round trips (read events) per job, one client, background subtracted."""
    for _ in range(3):
        fn()
    idle_c, idle_r = _counters(stack.client)
    time.sleep(1.0)
    idle_c2, idle_r2 = _counters(stack.client)
    idle = ((idle_c2 - idle_c - 1) / 1.0, (idle_r2 - idle_r - 1) / 1.0)  # minus our own INFO
    own_before = stack.own_reads[0]
    cmds_before = _command_calls(stack.client)
    c0, r0 = _counters(stack.client)
    started = time.perf_counter()
    for _ in range(jobs):
        fn()
    elapsed = time.perf_counter() - started
    c1, r1 = _counters(stack.client)
    cmds_after = _command_calls(stack.client)
    own = stack.own_reads[0] - own_before
    cmds_after["xread"] = cmds_after.get("xread", 0) - own  # the bench's own waits
    cmds_after["info"] = cmds_before.get("info", 0)
    per_command = {k: round((v - cmds_before.get(k, 0)) / jobs, 2) for k, v in cmds_after.items()
                   if v - cmds_before.get(k, 0) > 0}
    return {"commands": round((c1 - c0 - 2 - own - idle[0] * elapsed) / jobs, 1),
            "round_trips": round((r1 - r0 - 2 - own - idle[1] * elapsed) / jobs, 1),
            "idle_per_s": [round(idle[0], 1), round(idle[1], 1)],
            "by_command": dict(sorted(per_command.items(), key=lambda kv: -kv[1]))}


def _median_row(runs: list[dict]) -> dict:
    return {"n": sum(r["n"] for r in runs), "errors": sum(r["errors"] for r in runs), "runs": len(runs),
            "throughput": statistics.median(r["throughput"] for r in runs),
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests per level")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes per stack (default 2)")
    parser.add_argument("--api-workers", type=int, default=1,
                        help="API processes per stack (toolrail serve --api-workers; default 1)")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every level, interleaved; medians reported")
    parser.add_argument("--compare", type=Path, default=None, help="a checkout of other code to run side by side")
    parser.add_argument("--compare-label", default="before")
    parser.add_argument("--compare-api-workers", type=int, default=None,
                        help="API processes of the --compare stack (default: --api-workers; a tree without "
                             "--api-workers needs 1)")
    parser.add_argument("--label", default="after")
    parser.add_argument("--no-counts", action="store_true", help="skip the Redis work count per job")
    parser.add_argument("--http-client", default="stdlib", choices=["stdlib", "httpx"],
                        help="the load generator's HTTP client for the api-* rows (default stdlib: http.client, one "
                             "keep-alive connection per client thread; httpx: the load generator of earlier runs)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "executor.json"))
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    scale = 0.3 if args.quick else 1.0
    load_before = os.getloadavg()

    with ExitStack() as stacks:
        mine = stacks.enter_context(start_stack(args.label, ROOT, workers=args.workers, api_workers=args.api_workers,
                                                queues=("decide", "bench", "tool.get_weather")))
        os.environ["REDIS_URL"] = mine.url  # the bench's own Celery client publishes to this stack
        rows: dict[str, Callable[[], bool]] = dict(celery_runners(mine))
        stacked = [mine]
        if args.compare is not None:
            other = stacks.enter_context(start_stack(args.compare_label, args.compare.resolve(), workers=args.workers,
                                                     api_workers=args.compare_api_workers or args.api_workers))
            stacked.insert(0, other)
        for stack in stacked:
            rows.update({f"{name} [{stack.label}]" if args.compare else name: fn
                         for name, fn in job_runners(stack, args.http_client).items()})
        for fn in rows.values():  # warm-up
            for _ in range(5):
                fn()
        runs: dict[str, dict[int, list[dict]]] = {name: {level: [] for level in levels} for name in rows}
        for rep in range(args.repeat):
            for level in levels:
                for name, fn in rows.items():  # interleaved per level: same machine state
                    total = ROW_SIZES[name.split(" ")[0]]
                    n = max(level, int(total * scale)) if level > 1 else max(10, int(total * scale / 4))
                    runs[name][level].append(run_level(fn, n, level))
                    print(f"  [{rep + 1}/{args.repeat}] {name:24s} c={level:<3d} {runs[name][level][-1]}", file=sys.stderr)
        work: dict[str, dict] = {}
        if not args.no_counts:
            for stack in stacked:
                for name, fn in job_runners(stack, args.http_client).items():
                    key = f"{name} [{stack.label}]" if args.compare else name
                    work[key] = redis_work(stack, fn)
                    print(f"  redis work {key}: {work[key]}", file=sys.stderr)
    load_after = os.getloadavg()
    results = {name: {level: _median_row(r) for level, r in by_level.items()} for name, by_level in runs.items()}

    print(f"\n### executor benchmark ({args.workers} worker processes and {args.api_workers} API process(es) per stack, "
          f"{os.cpu_count()} cores, "
          f"median of {args.repeat} run(s); load average {load_before[0]:.2f} before, {load_after[0]:.2f} after)\n")
    print("| path | clients | jobs/s | p50 ms | p99 ms | throughput vs celery-noop | vs celery-fork | p99 overhead ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for level in levels:
        base, fork = results["celery-noop"][level], results["celery-fork"][level]
        for name in rows:
            r = results[name][level]
            print(f"| {name} | {level} | {r['throughput']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                  f"{r['throughput'] / base['throughput']:.2f}× | {r['throughput'] / fork['throughput']:.2f}× | "
                  f"{r['p99_ms'] - base['p99_ms']:+.1f} |")
    if work:
        print("\n| path | Redis commands / job | Redis round trips / job | top commands / job |")
        print("| --- | ---: | ---: | --- |")
        for name, w in work.items():
            top = ", ".join(f"{k} {v:g}" for k, v in list(w["by_command"].items())[:8])
            print(f"| {name} | {w['commands']:.1f} | {w['round_trips']:.1f} | {top} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"results": results, "runs": runs, "redis_work": work,
                                          "load_average": [load_before, load_after]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
