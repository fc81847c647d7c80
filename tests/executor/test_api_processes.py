"""``toolrail serve --api-workers N``: several API processes on one port, their metrics summed at every scrape,
and keep-alive connections that never wait on Nagle's algorithm."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_api_operations import _sample

from executor.serving import tcp_listener
from executor.sandbox.linux import children
from toolrail.redis_embed import free_port

REPO = Path(__file__).resolve().parents[2]
INLINE = {"type": "function", "function": {"name": "echo_city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _spawned_children(pid: int) -> list[int]:
    """The API processes uvicorn's supervisor spawned under ``pid`` (not multiprocessing's resource tracker)."""
    found = []
    for child in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def two_processes(redis_url: str) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--no-worker", "--api-workers", "2", "--port",
                             str(port), "--redis-url", redis_url], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TOOLRAIL_DECIDER": "none"},
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while len(_spawned_children(proc.pid)) < 2 or not _healthy(base):
            assert proc.poll() is None, "serve --api-workers 2 exited"
            assert time.monotonic() < deadline, "two API processes did not come up"
            time.sleep(0.2)
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_two_processes_share_the_port_and_sum_their_metrics(two_processes: tuple[str, subprocess.Popen]) -> None:
    base, proc = two_processes
    assert len(_spawned_children(proc.pid)) == 2
    jobs = 12
    for _ in range(jobs):  # a connection per request: the kernel hands them to either process
        r = httpx.post(f"{base}/v1/jobs", json={"tools": [INLINE], "tool_calls": [{"name": "echo_city",
                                                                                   "arguments": {"city": "Oslo"}}]})
        assert r.status_code == 202, r.text
    for _ in range(6):  # whichever process answers the scrape counts both processes' jobs
        text = httpx.get(f"{base}/metrics").text
        assert _sample(text, "toolrail_jobs_created_total", tenant="default") == jobs, text[:2000]
    # the latency of a request is observed once its response is sent, so the last one may land just after
    deadline = time.monotonic() + 10
    while True:
        text = httpx.get(f"{base}/metrics").text
        seen = _sample(text, "toolrail_http_request_duration_seconds_count", method="POST", route="/v1/jobs", status="202")
        if seen == jobs or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert seen == jobs, text[:2000]


def test_keep_alive_connections_of_several_processes_have_tcp_nodelay() -> None:
    """uvicorn binds the shared socket with proto 0, and asyncio then leaves Nagle on for every accepted
    connection (Kludex/uvicorn#3149): ours is bound with IPPROTO_TCP, so asyncio sets TCP_NODELAY."""
    listener = tcp_listener("127.0.0.1", 0)
    seen: list[int] = []

    async def main() -> None:
        server = await asyncio.start_server(lambda _r, w: seen.append(
            w.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)), sock=listener)
        async with server:
            _reader, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_api_workers_below_one_is_refused() -> None:
    out = subprocess.run([sys.executable, "-m", "toolrail.cli", "serve", "--no-worker", "--api-workers", "0"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--api-workers must be at least 1" in out.stderr
