"""MCP benchmark: what toolrail adds, side by side in one run, at client concurrency 1 and 16.

Rows (calls/s, p50 and p99 of one call, measured by the client):

- ``jobs-validate``         POST /v1/jobs with an inline tool's call → validated and stored (no run)
- ``jobs-sandboxed``        POST /v1/jobs with a get_weather call → validated, run in the sandbox, stored
- ``mcp-sandboxed``         tools/call get_weather on toolrail's /mcp (the official SDK's client, one
                            session per concurrent caller) → the same job path
- ``direct-mcp``            tools/call ``add`` on a small MCP server (the SDK, stateless streamable HTTP)
                            straight from the SDK's client: the floor
- ``jobs-mcp-provided``     POST /v1/jobs with a call of that server's ``add`` (``mcp__bench__add``): validated,
                            queued on ``mcp.default.bench``, called by a worker (on its pooled session)
- ``mcp-mcp-provided``      tools/call ``mcp__bench__add`` on toolrail's /mcp

Ratios: mcp-sandboxed / jobs-sandboxed (what the MCP face costs over the job API), and
jobs-mcp-provided / direct-mcp (what running an MCP tool through toolrail costs over calling it).
A job's latency is submit → terminal state (a blocking read of the job's event stream).
One stack: embedded Redis, ``--workers`` Celery processes, the API in-process. This machine is
shared: the load average before and after is printed with the table.
Usage: ``python bench/mcp.py [--quick] [--workers 2] [--out bench/results/mcp.md]``.

``--fairness``: another tenant's ``/mcp tools/list`` latency alone and while one tenant's 12
registrations wait on a server that never answers (issue 25: 0.23 s alone, 19.8 s during, when
registrations held the API's thread pool); the ratio during / alone is the figure (target: ≤ 2×).
``--call-fairness``: another tenant's sandboxed ``get_weather`` job alone and while one tenant has 6
calls hanging on its MCP server (2 workers, ``TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT=1``; issue 25:
0.23 s alone, 56.5 s during two hanging calls, when they held both workers).
"""

from __future__ import annotations

import importlib
import os
import sys

if __name__ == "mcp":  # pragma: no cover - imported by mistake as the SDK (bench/ on sys.path): hand over to it
    _here, _saved = os.path.dirname(os.path.abspath(__file__)), sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _here]
    try:
        del sys.modules["mcp"]
        _real = importlib.import_module("mcp")
    finally:
        sys.path[:] = _saved
    sys.modules["mcp"] = _real  # what the importer gets (the import system returns sys.modules["mcp"]): the SDK

import argparse  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Awaitable, Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import anyio  # noqa: E402
import httpx  # noqa: E402
import redis  # noqa: E402
import redis.asyncio  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mcp_types as types  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.server import Server  # noqa: E402

from executor.stack import LocalStack  # noqa: E402
from executor.store.records import TERMINAL_JOB  # noqa: E402

INLINE_TOOL = {"type": "function", "function": {"name": "echo_city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER = {"city": "Shanghai", "date": "tomorrow"}


def _add_server() -> Server:
    async def list_tools(ctx, params):  # noqa: ANN001, ANN202
        return types.ListToolsResult(tools=[types.Tool(
            name="add", description="Add two integers.", input_schema={"type": "object", "properties": {
                "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
            output_schema={"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}),
            types.Tool(name="wait", description="Answer after some seconds.", input_schema={
                "type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]})])

    async def call_tool(ctx, params):  # noqa: ANN001, ANN202
        args = params.arguments or {}
        if params.name == "wait":  # --call-fairness: a call that takes its time
            await anyio.sleep(float(args["seconds"]))
            return types.CallToolResult(content=[types.TextContent(text="waited")], structured_content={"waited": True})
        return types.CallToolResult(content=[types.TextContent(text="sum")], structured_content={"sum": args["a"] + args["b"]})

    return Server("bench", on_list_tools=list_tools, on_call_tool=call_tool)


def _serve_add() -> tuple[str, Callable[[], None]]:
    import uvicorn  # noqa: PLC0415

    app = _add_server().streamable_http_app(stateless_http=True)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not (server.started and server.servers):
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp", lambda: (setattr(server, "should_exit", True), thread.join(10))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


async def _level(make_caller: Callable[[], Awaitable[tuple[Callable[[int], Awaitable[bool]], Callable[[], Awaitable[None]]]]],
                 *, concurrency: int, calls: int) -> dict[str, float]:
    """``calls`` calls from ``concurrency`` callers, each with its own caller (session/connection)."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(calls))

    async def one_caller() -> None:
        nonlocal errors
        call, close = await make_caller()
        try:
            for index in counter:
                started = time.perf_counter()
                ok = await call(index)
                latencies.append(time.perf_counter() - started)
                errors += 0 if ok else 1
        finally:
            await close()

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(one_caller)
    wall = time.perf_counter() - started
    return {"calls_per_s": len(latencies) / wall, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000, "errors": errors, "n": len(latencies)}


def _mcp_caller(url: str, tool: str, arguments: Callable[[int], dict]) -> Callable:
    async def make():  # noqa: ANN202
        client = Client(url, cache=None)
        await client.__aenter__()

        async def call(index: int) -> bool:
            result = await client.call_tool(tool, arguments(index))
            return not result.is_error

        return call, lambda: client.__aexit__(None, None, None)

    return make


def _job_caller(api: str, redis_url: str, body: Callable[[int], dict]) -> Callable:
    async def make():  # noqa: ANN202
        http = httpx.AsyncClient(base_url=api, timeout=120)
        events = redis.asyncio.Redis.from_url(redis_url)

        async def call(index: int) -> bool:
            job_id = (await http.post("/v1/jobs", json=body(index))).json()["job_id"]
            last, deadline = "0", time.monotonic() + 120
            while time.monotonic() < deadline:
                chunk = await events.xread({f"tr:job:{job_id}:events": last}, block=5000, count=100)
                for _key, entries in chunk or []:
                    for entry_id, fields in entries:
                        last = entry_id
                        data = json.loads(fields[b"data"])
                        if data.get("type") == "status" and data.get("status") in TERMINAL_JOB:
                            return data["status"] == "succeeded"
            return False

        async def close() -> None:
            await http.aclose()
            await events.aclose()

        return call, close

    return make


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "mcp.md"))
    parser.add_argument("--fairness", action="store_true", help="only the two-tenant registration rows")
    parser.add_argument("--call-fairness", action="store_true", help="only the two-tenant MCP call rows")
    args = parser.parse_args()
    if args.fairness:
        return fairness(hanging=12, samples=5 if args.quick else 20)
    if args.call_fairness:
        return call_fairness(hanging=6, samples=5 if args.quick else 10)
    sizes = {1: 10 if args.quick else 30, 16: 48 if args.quick else 160}
    load_before = os.getloadavg()
    add_url, stop_add = _serve_add()
    results: dict[tuple[str, int], dict[str, float]] = {}
    with LocalStack(concurrency=args.workers, worker_env={"TOOLRAIL_DECIDER": "none", "TOOLRAIL_LOG_LEVEL": "WARNING"}) as stack:
        with httpx.Client(base_url=stack.url, timeout=60) as client:
            client.post("/v1/mcp-servers", json={"name": "bench", "url": add_url}).raise_for_status()
            time.sleep(1.0)  # the workers' add_consumer for mcp.default.bench
        rows = {
            "jobs-validate": _job_caller(stack.url, stack.redis_url, lambda i: {
                "tools": [INLINE_TOOL], "tool_calls": [{"name": "echo_city", "arguments": {"city": f"c{i}"}}]}),
            "jobs-sandboxed": _job_caller(stack.url, stack.redis_url, lambda i: {
                "tools": ["get_weather"], "tool_calls": [{"name": "get_weather", "arguments": WEATHER}]}),
            "mcp-sandboxed": _mcp_caller(f"{stack.url}/mcp", "get_weather", lambda i: WEATHER),
            "direct-mcp": _mcp_caller(add_url, "add", lambda i: {"a": i, "b": 1}),
            "jobs-mcp-provided": _job_caller(stack.url, stack.redis_url, lambda i: {
                "tools": ["mcp__bench__add"], "tool_calls": [{"name": "mcp__bench__add", "arguments": {"a": i, "b": 1}}]}),
            "mcp-mcp-provided": _mcp_caller(f"{stack.url}/mcp", "mcp__bench__add", lambda i: {"a": i, "b": 1}),
        }
        for level in (1, 16):
            for name, make in rows.items():  # interleaved: every row of a level runs under the same load
                results[(name, level)] = anyio.run(lambda m=make, c=level: _level(m, concurrency=c, calls=sizes[c]))
                r = results[(name, level)]
                print(f"{name:<20} c={level:<3} {r['calls_per_s']:7.1f}/s  p50 {r['p50_ms']:8.1f} ms  "
                      f"p99 {r['p99_ms']:8.1f} ms  errors {r['errors']}", flush=True)
    stop_add()
    load_after = os.getloadavg()
    _write(Path(args.out), results, sizes=sizes, workers=args.workers, load=(load_before, load_after))
    print(f"wrote {args.out}")
    return 0


def fairness(*, hanging: int, samples: int) -> int:
    """Beta's tools/list p50/p99 alone, then while alpha's ``hanging`` registrations wait on a silent server."""
    import socket  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from executor.api.app import create_app  # noqa: PLC0415
    from executor.runtime import Runtime  # noqa: PLC0415
    from executor.stack import serve_in_thread  # noqa: PLC0415
    from toolrail.redis_embed import EmbeddedRedis  # noqa: PLC0415
    from mcpbridge.settings import mcp_settings  # noqa: PLC0415
    from toolrail.settings import Settings  # noqa: PLC0415

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # accepts (the kernel's backlog) and never answers
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}/mcp"
    store = EmbeddedRedis(data_dir=Path(tempfile.mkdtemp(prefix="bench-mcp-"))).start()
    settings = Settings(api_keys="ka:alpha,kb:beta", redis_url=store.url, rate_limit_per_s=10_000, rate_limit_burst=10_000)
    os.environ.update({"TOOLRAIL_MCP_ALLOW_PRIVATE_URLS": "true", "TOOLRAIL_MCP_REFRESH_INTERVAL_S": "0",  # the bridge's own
                       "TOOLRAIL_MCP_CONNECT_TIMEOUT_S": "10", "TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT": str(hanging)})
    mcp_settings.cache_clear()
    server, thread, base = serve_in_thread(create_app(settings, Runtime.from_settings(settings), mount_openai=False,
                                                      enqueue=lambda job: None, ping_workers=lambda: 1))
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": "Bearer kb", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}

    def sample() -> list[float]:
        took = []
        for _ in range(samples):
            started = time.perf_counter()
            httpx.post(f"{base}/mcp", json=body, headers=headers, timeout=60).raise_for_status()
            took.append(time.perf_counter() - started)
        return took

    try:
        alone = sample()
        with ThreadPoolExecutor(hanging) as pool, httpx.Client(base_url=base, timeout=60,
                                                               headers={"Authorization": "Bearer ka"}) as alpha:
            pending = [pool.submit(alpha.post, "/v1/mcp-servers", json={"name": f"hang{i}", "url": silent_url})
                       for i in range(hanging)]
            time.sleep(0.5)
            during = sample()
            codes = sorted({f.result().status_code for f in pending})
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.stop()
        silent.close()
    a50, d50 = percentile(alone, 0.5) * 1000, percentile(during, 0.5) * 1000
    print(f"beta tools/list alone   p50 {a50:7.1f} ms  p99 {percentile(alone, 0.99) * 1000:7.1f} ms")
    print(f"beta tools/list during  p50 {d50:7.1f} ms  p99 {percentile(during, 0.99) * 1000:7.1f} ms  "
          f"({hanging} hanging registrations of alpha, answered {codes})")
    print(f"during / alone (p50): {d50 / a50:.2f}x")
    return 0


def call_fairness(*, hanging: int, samples: int) -> int:
    """Beta's get_weather job latency alone, then while alpha's ``hanging`` MCP calls hang (limit 1 per tenant)."""
    env = {"TOOLRAIL_API_KEYS": "ka:alpha,kb:beta", "TOOLRAIL_MCP_ALLOW_PRIVATE_URLS": "1",
           "TOOLRAIL_DEMO_TOOLS": "get_weather", "TOOLRAIL_MCP_MAX_CONCURRENT_PER_TENANT": "1"}
    os.environ.update(env)
    add_url, stop_add = _serve_add()
    weather = {"tools": ["get_weather"], "tool_calls": [{"name": "get_weather", "arguments": WEATHER}]}
    hang = {"tools": ["mcp__flood__wait"], "tool_calls": [{"name": "mcp__flood__wait", "arguments": {"seconds": 25}}]}
    with LocalStack(concurrency=2, worker_env={"TOOLRAIL_DECIDER": "none", "TOOLRAIL_LOG_LEVEL": "WARNING",
                                               **env}) as stack:
        alpha = httpx.Client(base_url=stack.url, timeout=60, headers={"Authorization": "Bearer ka"})
        flood = {"name": "flood", "url": add_url, "timeout_s": 30, "idle_timeout_s": 30}
        alpha.post("/v1/mcp-servers", json=flood).raise_for_status()
        time.sleep(1.0)  # the workers' add_consumer for mcp.alpha.flood

        def beta_jobs() -> list[float]:
            took = []
            with httpx.Client(base_url=stack.url, timeout=120, headers={"Authorization": "Bearer kb"}) as beta:
                for _ in range(samples):
                    started = time.perf_counter()
                    job_id = beta.post("/v1/jobs", json=weather).json()["job_id"]
                    while beta.get(f"/v1/jobs/{job_id}").json()["status"] not in TERMINAL_JOB:
                        time.sleep(0.02)
                    took.append(time.perf_counter() - started)
            return took

        beta_jobs()  # warm: each worker's first sandboxed call starts its fork server
        alone = beta_jobs()
        flood_jobs = [alpha.post("/v1/jobs", json=hang).json()["job_id"] for _ in range(hanging)]
        time.sleep(2.0)  # alpha's calls have reached the workers (one runs, the rest go back to the queue)
        during = beta_jobs()
        states = sorted(alpha.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in flood_jobs)
        alpha.close()
    stop_add()
    a50, d50 = percentile(alone, 0.5) * 1000, percentile(during, 0.5) * 1000
    print(f"beta get_weather alone   p50 {a50:8.1f} ms  max {max(alone) * 1000:8.1f} ms")
    print(f"beta get_weather during  p50 {d50:8.1f} ms  max {max(during) * 1000:8.1f} ms  ({hanging} of alpha's MCP "
          "calls hanging 25 s, 2 workers, 1 MCP call per tenant)")
    print(f"alpha's jobs meanwhile: {states}")
    print(f"during / alone (p50): {d50 / a50:.2f}x")
    return 0


def _ratio(results: dict, a: str, b: str, level: int, key: str) -> str:
    x, y = results[(a, level)][key], results[(b, level)][key]
    return f"{x / y:.2f}×" if y else "n/a"


def _write(path: Path, results: dict, *, sizes: dict, workers: int, load: tuple) -> None:
    lines = ["# MCP: toolrail's overhead, side by side (bench/mcp.py)", "",
             f"One run, {workers} Celery worker processes, embedded Redis, API in-process; calls per row: "
             f"{sizes[1]} at c=1, {sizes[16]} at c=16. Load average before {load[0][0]:.2f} / after {load[1][0]:.2f} "
             f"on {os.cpu_count()} cores (a shared, noisy machine: compare rows of one run, not runs).", "",
             "| row | c | calls/s | p50 ms | p99 ms | errors |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for (name, level), r in results.items():
        lines.append(f"| {name} | {level} | {r['calls_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['errors']} |")
    lines += ["", "| ratio | c=1 p50 | c=1 calls/s | c=16 p50 | c=16 calls/s |", "| --- | ---: | ---: | ---: | ---: |"]
    for label, a, b in (("mcp-sandboxed / jobs-sandboxed", "mcp-sandboxed", "jobs-sandboxed"),
                        ("jobs-sandboxed / jobs-validate", "jobs-sandboxed", "jobs-validate"),
                        ("jobs-mcp-provided / direct-mcp", "jobs-mcp-provided", "direct-mcp"),
                        ("mcp-mcp-provided / direct-mcp", "mcp-mcp-provided", "direct-mcp")):
        lines.append(f"| {label} | {_ratio(results, a, b, 1, 'p50_ms')} | {_ratio(results, a, b, 1, 'calls_per_s')} | "
                     f"{_ratio(results, a, b, 16, 'p50_ms')} | {_ratio(results, a, b, 16, 'calls_per_s')} |")
    lines += ["", "direct-mcp reuses one SDK session per caller; a worker keeps one session per (tenant, server) "
              "per process (mcpbridge.pool), so what jobs-mcp-provided adds is the job path: submit, check, queue, "
              "record, and the wait on the job's event stream.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
