"""Soak: the default stack (``toolrail serve``) at a steady mixed load for ``--minutes``, with worker kills.

    python bench/soak.py --minutes 120 [--rate 2] [--kill-every 180] [--sample-every 60]

One ``toolrail serve`` (its worker pool; a Redis of the soak's own; the scripted decider, so that decisions need
no model; the tests' tools; traces kept in Redis) takes, at ``--rate`` jobs per second, a mix of: decisions,
validate-only jobs, sandboxed side-effecting transfers (the ledger), MCP calls (an SDK-written HTTP server), jobs
with a webhook, jobs that wait for approval (then approved) and jobs cancelled mid-call. Every ``--kill-every``
seconds a worker process is SIGKILLed, a pool process and the main process in turn. Every ``--sample-every``
seconds: RSS and open fds of serve's whole process tree, Redis keys and used memory, and the trace store's keys.

At the end (after a drain): every job accounted for (terminal, by status), each succeeded transfer applied once
(the ledger), growth per hour of each sampled figure (least squares), and a plot. Writes
``bench/results/soak-<stamp>.json`` and ``.png``. Not part of ``make test``. Exit 1 when a job was lost or a transfer
applied twice.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402

from executor.job_client import wait_for_job  # noqa: E402
from executor.stack import stop_process  # noqa: E402
from executor.store.records import TERMINAL_JOB  # noqa: E402
from tests.harness.receiver import Receiver  # noqa: E402
from toolrail.lifeline import dies_with_parent  # noqa: E402
from toolrail.redis_embed import EmbeddedRedis, free_port  # noqa: E402
from tools.ledger import Ledger  # noqa: E402

PREFIX = "soak:ledger"
INLINE = {"type": "function", "function": {"name": "book_table", "parameters": {
    "type": "object", "properties": {"people": {"type": "integer"}}, "required": ["people"]}}}
KINDS = ("decide", "validate", "transfer", "mcp", "webhook", "approval", "cancel")


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent:
                found.append(child)
                frontier.append(child)
    return found


def sample(serve_pid: int, client: redis.Redis, started: float) -> dict[str, float]:
    rss_kb, fds = 0, 0
    for pid in tree(serve_pid):
        try:
            rss_kb += next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, StopIteration):
            continue
    traces = sum(1 for pattern in ("tr:trace:*", "tr:tenant:*:trace:*") for _ in client.scan_iter(pattern, count=1000))
    return {"minute": round((time.monotonic() - started) / 60, 2), "rss_mb": round(rss_kb / 1024, 1), "fds": fds,
            "redis_keys": int(client.dbsize()), "redis_used_mb": round(client.info("memory")["used_memory"] / 2**20, 2),
            "trace_keys": traces}


def per_hour(points: list[dict[str, float]], key: str) -> float:
    """Least-squares slope of ``key`` against time, per hour."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p["minute"] / 60 for p in points], [p[key] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return round(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den, 2) if den else 0.0


def celery_main(serve_pid: int) -> int | None:
    for pid in tree(serve_pid)[1:]:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"celery" in cmd and int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == serve_pid:
                return pid
        except (OSError, ValueError):
            continue
    return None


def submit(api: httpx.Client, kind: str, rng: random.Random, hook: str) -> tuple[str, str] | None:
    body: dict[str, Any]
    if kind == "decide":
        script = json.dumps({"steps": [{"text": "decided", "sleep_s": 0.2}]})
        body = {"messages": [{"role": "user", "content": f"RUN {script}"}], "tools": ["slow_echo"]}
    elif kind == "validate":
        body = {"tools": [INLINE], "raw_output": json.dumps({"name": "book_table", "arguments": {"people": "4"}})}
    elif kind in ("transfer", "approval", "cancel"):
        args = {"from_account": "alice", "to": "bob", "amount": rng.randint(1, 99) / 100,
                "delay_s": 3 if kind == "cancel" else 0.3}
        body = {"tool_calls": [{"name": "slow_transfer", "arguments": args}], "tools": ["slow_transfer"]}
        if kind == "approval":
            body["require_approval"] = ["slow_transfer"]
    elif kind == "mcp":
        body = {"tools": ["mcp__soak__add"], "tool_calls": [{"name": "mcp__soak__add",
                                                            "arguments": {"a": rng.randint(0, 9), "b": 1}}]}
    else:
        body = {"tool_calls": [{"name": "slow_echo", "arguments": {"value": "hook"}}], "tools": ["slow_echo"],
                "webhook_url": hook}
    try:
        created = api.post("/v1/jobs", json=body)
    except httpx.HTTPError:
        return None
    return (created.json()["job_id"], kind) if created.status_code == 202 else None


def follow_up(api: httpx.Client, job_id: str, kind: str) -> None:
    """Approve an approval job's call once it waits; cancel a cancel job once its call runs."""
    want = "awaiting_approval" if kind == "approval" else "running"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            job = api.get(f"/v1/jobs/{job_id}").json()
        except httpx.HTTPError:
            time.sleep(0.5)
            continue
        if job["status"] in TERMINAL_JOB:
            return
        if job["status"] == want:
            if kind == "approval":
                api.post(f"/v1/jobs/{job_id}/calls/{job['calls'][0]['id']}/approve")
            else:
                api.post(f"/v1/jobs/{job_id}/cancel")
            return
        time.sleep(0.2)


def drain(api: httpx.Client, job_id: str) -> str:
    """The job's end (a call still waiting for approval, its follow-up missed during a kill, is approved now)."""
    job = wait_for_job(api, job_id, timeout_s=120, poll_s=0.2, until={"awaiting_approval"})
    if job["status"] == "awaiting_approval":
        for call in job["calls"]:
            if (call.get("approval") or {}).get("state") == "pending":
                api.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
        job = wait_for_job(api, job_id, timeout_s=120, poll_s=0.2)
    return job["status"]


def main() -> int:  # noqa: PLR0915 - one run, read top to bottom
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=2.0, help="jobs submitted per second")
    parser.add_argument("--kill-every", type=float, default=180.0, help="seconds between worker kills (0: none)")
    parser.add_argument("--sample-every", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=35)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="toolrail-soak-"))
    store = EmbeddedRedis(data_dir=work / "redis").start()
    client = redis.Redis.from_url(store.url)
    Ledger(client, prefix=PREFIX).seed({"alice": {"CNY": 10**12}, "bob": {"CNY": 10**12}})
    from tests.mcpbridge.mcp_servers import serve_http  # noqa: PLC0415

    mcp_url, stop_mcp = serve_http("good")
    port = free_port()
    env = {**os.environ, "TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": "tests.executor.scripted_decider:make",
           "TOOLRAIL_TOOL_MODULES": "tests.executor.tools_for_tests", "TOOLRAIL_LEDGER_PREFIX": PREFIX,
           "TOOLRAIL_TRACE_STORE": "redis", "TOOLRAIL_RATE_LIMIT_PER_S": "0", "TOOLRAIL_WEBHOOK_ALLOW_PRIVATE": "1",
           "TOOLRAIL_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"soak-webhook-signing-key-0123456").decode(),
           "TOOLRAIL_MCP_ALLOW_PRIVATE_URLS": "1", "TOOLRAIL_LOG_LEVEL": "WARNING", "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    log = open(work / "serve.log", "ab")  # noqa: SIM115 - the serve's for the whole run
    serve = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port), "--redis-url", store.url],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                             preexec_fn=dies_with_parent())
    assert serve.stdout is not None and serve.stdout.readline().startswith("toolrail serve: ready"), "serve did not start"
    base = f"http://127.0.0.1:{port}"
    print(f"serve ready at {base} (logs: {work})", flush=True)
    receiver = Receiver(status=204)
    api = httpx.Client(base_url=base, timeout=30)
    api.post("/v1/mcp-servers", json={"name": "soak", "url": mcp_url}).raise_for_status()
    jobs: list[tuple[str, str]] = []
    samples: list[dict[str, float]] = []
    kills: list[dict[str, Any]] = []
    started = time.monotonic()
    end = started + args.minutes * 60
    next_sample, next_kill, kill_main = started, started + (args.kill_every or float("inf")), False
    helpers: list[threading.Thread] = []
    try:
        while (now := time.monotonic()) < end:
            if now >= next_sample:
                samples.append(sample(serve.pid, client, started))
                print(json.dumps(samples[-1]), flush=True)
                next_sample += args.sample_every
            if now >= next_kill:
                main_pid = celery_main(serve.pid)
                pool = [p for p in tree(main_pid)[1:]] if main_pid else []
                victim = main_pid if kill_main or not pool else pool[0]
                if victim:
                    os.kill(victim, signal.SIGKILL)
                    kills.append({"minute": round((now - started) / 60, 2), "process": "main" if victim == main_pid else "pool"})
                kill_main, next_kill = not kill_main, next_kill + args.kill_every
            made = submit(api, rng.choice(KINDS), rng, receiver.url("/hook"))
            if made is not None:
                jobs.append(made)
                if made[1] in ("approval", "cancel"):
                    helper = threading.Thread(target=follow_up, args=(httpx.Client(base_url=base, timeout=30), *made),
                                              daemon=True)
                    helper.start()
                    helpers.append(helper)
            time.sleep(max(0.0, 1 / args.rate - (time.monotonic() - now)))
        for helper in helpers:
            helper.join(timeout=30)
        ended = {job_id: drain(api, job_id) for job_id, _ in jobs}
        samples.append(sample(serve.pid, client, started))
    finally:
        stop_process(serve, grace_s=20)
        receiver.close()
        stop_mcp()
    applications = Ledger(client, prefix=PREFIX).applications()
    keys = [entry["key"] for entry in applications]
    by_status: dict[str, int] = {}
    for status in ended.values():
        by_status[status] = by_status.get(status, 0) + 1
    lost = [job_id for job_id, status in ended.items() if status not in TERMINAL_JOB]
    figures = {"minutes": args.minutes, "kill_every_s": args.kill_every, "rate": args.rate, "jobs": len(jobs), "by_status": by_status,
               "by_kind": {k: sum(1 for _, kind in jobs if kind == k) for k in KINDS}, "lost": len(lost),
               "lost_ids": lost[:10], "transfers_applied": len(keys), "applied_twice": len(keys) - len(set(keys)),
               "kills": kills, "webhook_deliveries": len(receiver.seen("/hook")),
               "growth_per_hour": {k: per_hour(samples, k) for k in ("rss_mb", "fds", "redis_keys", "redis_used_mb",
                                                                      "trace_keys")},
               "samples": samples}
    store.stop()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = ROOT / "bench" / "results" / f"soak-{stamp}"
    out.with_suffix(".json").write_text(json.dumps(figures, indent=2))
    plot(samples, kills, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in figures.items() if k != "samples"}, indent=2))
    print(f"wrote {out.with_suffix('.json')} and .png")
    return 1 if lost or figures["applied_twice"] else 0


def plot(samples: list[dict[str, float]], kills: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    keys = ("rss_mb", "fds", "redis_keys", "redis_used_mb", "trace_keys")
    fig, axes = plt.subplots(len(keys), 1, figsize=(8, 2.2 * len(keys)), sharex=True)
    minutes = [s["minute"] for s in samples]
    for ax, key in zip(axes, keys):
        ax.plot(minutes, [s[key] for s in samples], marker=".")
        for kill in kills:
            ax.axvline(kill["minute"], color="red" if kill["process"] == "main" else "orange", alpha=0.3, lw=0.8)
        ax.set_ylabel(key)
    axes[-1].set_xlabel("minutes (red: main process killed, orange: pool process)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
