"""API load test on loopback: does the API hold its p99 where it starts shedding with 429s?

    python bench/load.py [--limit 100] [--steps 0.1,0.5,0.9,1.2,1.6,2.4] [--step-s 5]

Starts a redis-server and the API (uvicorn, one process) of its own with a per-tenant
token bucket of ``--limit`` requests/s (burst: one second's worth). An asyncio/httpx client
offers open-loop load — requests on a fixed schedule, whether or not earlier ones have
answered — at each multiple of the limit for ``--step-s`` seconds, submitting jobs
(``POST /v1/jobs``; no workers: this measures the API tier). Prints per step the 202s,
429s and errors, and p50/p99 of every response; then the p99 at the first step that sheds
(≥ 1 % 429s) against the unloaded p99 (the first step). Bounded: steps × step-s seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executor.stack import wait_http_ok  # noqa: E402
from toolrail.redis_embed import EmbeddedRedis, free_port  # noqa: E402

BODY = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing", "date": "today"}}]}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def step(url: str, rate: float, seconds: float, timeout_s: float) -> dict:
    results: list[tuple[int, float]] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        async def one() -> None:
            started = time.perf_counter()
            try:
                response = await client.post("/v1/jobs", json=BODY)
                results.append((response.status_code, time.perf_counter() - started))
            except httpx.HTTPError:
                results.append((0, time.perf_counter() - started))

        tasks = []
        begin = time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    latencies = [lat for status, lat in results if status]
    return {"rate": rate, "sent": len(results), "accepted": sum(1 for s, _ in results if s == 202),
            "shed": sum(1 for s, _ in results if s == 429), "errors": sum(1 for s, _ in results if s not in (202, 429)),
            "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99),
            "p99_accepted": pct([lat for s, lat in results if s == 202], 0.99)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=float, default=100.0, help="per-tenant rate limit, requests/s")
    parser.add_argument("--steps", default="0.1,0.5,0.9,1.2,1.6,2.4", help="offered load as multiples of the limit")
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="toolrail-load-"))
    server = EmbeddedRedis(data_dir=data / "redis").start()
    port = free_port()
    env = {**os.environ, "REDIS_URL": server.url, "TOOLRAIL_DECIDER": "none", "TOOLRAIL_RATE_LIMIT_PER_S": str(args.limit),
           "TOOLRAIL_RATE_LIMIT_BURST": str(int(args.limit)), "TOOLRAIL_API_KEYS": "", "TOOLRAIL_LOG_JSON": "1",
           "PYTHONPATH": str(ROOT)}
    api = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "tests.chaos.chaos_harness:api_factory",
                            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
                           env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url)
        asyncio.run(step(url, 20, 1.0, args.timeout))  # warm-up
        rows = []
        print(f"limit {args.limit:g} req/s per tenant; {args.step_s:g} s per step, open-loop POST /v1/jobs")
        print(f"{'offered/s':>10}{'sent':>7}{'202':>7}{'429':>7}{'err':>6}{'p50 ms':>9}{'p99 ms':>9}{'p99 202 ms':>12}")
        for multiple in (float(m) for m in args.steps.split(",")):
            time.sleep(1.5)  # the bucket refills between steps
            row = asyncio.run(step(url, args.limit * multiple, args.step_s, args.timeout))
            rows.append(row)
            print(f"{row['rate']:>10.0f}{row['sent']:>7}{row['accepted']:>7}{row['shed']:>7}{row['errors']:>6}"
                  f"{row['p50'] * 1000:>9.1f}{row['p99'] * 1000:>9.1f}{row['p99_accepted'] * 1000:>12.1f}")
    finally:
        api.terminate()
        api.wait(timeout=10)
        server.stop()
    unloaded = rows[0]["p99"]
    shedding = next((r for r in rows if r["shed"] >= 0.01 * r["sent"]), None)
    if shedding is None:
        print("no step shed with 429s: raise --steps")
        return 1
    ratio = shedding["p99"] / unloaded
    print(f"unloaded p99 {unloaded * 1000:.1f} ms; at {shedding['rate']:.0f}/s offered (first step with 429s: "
          f"{shedding['shed']}/{shedding['sent']}) p99 {shedding['p99'] * 1000:.1f} ms → {ratio:.2f}x "
          f"({'held' if ratio < 2 else 'NOT held'}: target < 2x); timeouts/errors there: {shedding['errors']}")
    heaviest = rows[-1]
    print(f"heaviest step {heaviest['rate']:.0f}/s: p99 {heaviest['p99'] * 1000:.1f} ms "
          f"({heaviest['p99'] / unloaded:.2f}x), {heaviest['shed']} shed, {heaviest['errors']} errors")
    return 0 if ratio < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
