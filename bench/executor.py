"""Executor benchmark: the full pipeline against bare Celery, side by side in one run.

Rows, each at client concurrency 1, 16 and 64, on one Redis and one worker pool:

- ``celery-noop``    publish a no-op task; the task signals completion in Redis (the floor)
- ``api-validate``   POST /v1/jobs with an inline tool's call → validated, stored (API + 1 task hop)
- ``api-sandboxed``  POST /v1/jobs with a get_weather call → validated, run in a sandboxed
                     process, stored (API + 2 task hops + a process per call)

Latency is submit → terminal state stored (waited on with a blocking read of the job's
event stream, so polling adds nothing). Prints throughput, p50/p99 and the ratios to the
baseline. Usage: ``python bench/executor.py [--quick] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from executor.stack import start_worker, stop_process, wait_for_workers, wait_http_ok  # noqa: E402
from executor.store import TERMINAL_JOB  # noqa: E402
from toolrail.redis_embed import EmbeddedRedis, free_port  # noqa: E402

INLINE_TOOL = {"type": "function", "function": {"name": "echo_city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_level(fn, total: int, concurrency: int) -> dict:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests per level")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes (default 2)")
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out" / "executor.json"))
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    scale = 0.3 if args.quick else 1.0

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(data_dir=Path(tmp) / "redis") as server:
        url = server.url
        env = {"TOOLRAIL_DECIDER": "none", "TOOLRAIL_LOG_LEVEL": "WARNING", "REDIS_URL": url}
        os.environ.update(env)
        worker = start_worker(url, queues=["decide", "bench", "tool.get_weather"], concurrency=args.workers, env=env)
        port = free_port()
        api = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--no-worker", "--port", str(port)],
                               env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        try:
            wait_for_workers(url, timeout_s=60)
            base = f"http://127.0.0.1:{port}"
            wait_http_ok(base)
            from executor.tasks import noop  # noqa: PLC0415 - after REDIS_URL is set

            client = redis.Redis.from_url(url)
            http = httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_connections=128))

            def celery_noop() -> bool:
                token = uuid.uuid4().hex
                noop.apply_async(args=[token], queue="bench")
                return client.blpop([f"bench:done:{token}"], timeout=60) is not None

            def wait_job(job_id: str) -> bool:
                key, last = f"tr:job:{job_id}:events", "0"
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    for _stream, entries in client.xread({key: last}, block=5000) or []:
                        for entry_id, fields in entries:
                            last = entry_id
                            data = json.loads(fields[b"data"])
                            if data.get("type") == "status" and data.get("status") in TERMINAL_JOB:
                                return data["status"] == "succeeded"
                return False

            def api_validate() -> bool:
                r = http.post("/v1/jobs", json={"tools": [INLINE_TOOL], "tool_calls": [{"name": "echo_city", "arguments": {"city": "Paris"}}]})
                return r.status_code == 202 and wait_job(r.json()["job_id"])

            def api_sandboxed() -> bool:
                r = http.post("/v1/jobs", json={"tools": ["get_weather"], "tool_calls": [
                    {"name": "get_weather", "arguments": {"city": "Paris", "date": "today"}}]})
                return r.status_code == 202 and wait_job(r.json()["job_id"])

            rows = {"celery-noop": (celery_noop, 400), "api-validate": (api_validate, 200), "api-sandboxed": (api_sandboxed, 120)}
            for fn, _ in rows.values():  # warm-up
                for _ in range(5):
                    fn()
            results: dict[str, dict[int, dict]] = {name: {} for name in rows}
            for level in levels:
                for name, (fn, total) in rows.items():  # interleaved per level: same machine state
                    n = max(level, int(total * scale)) if level > 1 else max(10, int(total * scale / 4))
                    results[name][level] = run_level(fn, n, level)
                    print(f"  {name:14s} c={level:<3d} {results[name][level]}", file=sys.stderr)
        finally:
            stop_process(api)
            stop_process(worker)

    print(f"\n### executor benchmark ({args.workers} worker processes, {os.cpu_count()} cores)\n")
    print("| path | clients | jobs/s | p50 ms | p99 ms | throughput vs celery | p99 overhead ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in rows:
        for level in levels:
            r, b = results[name][level], results["celery-noop"][level]
            print(f"| {name} | {level} | {r['throughput']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                  f"{r['throughput'] / b['throughput']:.2f}× | {r['p99_ms'] - b['p99_ms']:+.1f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
