"""Chaos harness: a whole toolrail of its own (Redis, API, Celery workers) to break on purpose.

Used by ``tests/chaos`` (short runs) and ``bench/chaos.py`` (100+ kills). Everything is a
real process: a ``redis-server`` owned by the harness (restartable on the same port, data
kept across a ``SHUTDOWN SAVE``), the API under uvicorn, and Celery workers with a short
visibility timeout so that a killed main worker's unacked messages come back in seconds.

The load is side-effecting transfers (``chaos_transfer``) between ledger accounts with
enough money that none can fail for funds; afterwards ``verify`` checks every job is
terminal and the ledger exact: each succeeded transfer applied once, no failed job
applied, balances equal to seed plus succeeded transfers, totals conserved.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from executor.sandbox.linux import children
from executor.stack import start_worker, wait_for_workers, wait_http_ok
from executor.store.records import TERMINAL_JOB
from toolrail.redis_embed import EmbeddedRedis, free_port
from tools.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
LEDGER_PREFIX = "chaos:ledger"
ACCOUNTS = [f"acct{i}" for i in range(8)]
SEED_CENTS = 10_000_000_000
QUEUES = ["decide", "tool.chaos_transfer", "tool.linger"]


def api_factory():  # noqa: ANN201 - ``uvicorn --factory`` entry point, configured by the environment
    from executor.api.app import create_app  # noqa: PLC0415
    from executor.runtime import Runtime  # noqa: PLC0415
    from toolrail.settings import get_settings  # noqa: PLC0415

    settings = get_settings()
    return create_app(settings, Runtime.from_settings(settings), mount_openai=False)


@dataclass
class Submitted:
    job_id: str
    from_account: str
    to: str
    cents: int


@dataclass
class ChaosStack:
    """Redis + API + ``workers`` Celery workers, all child processes of this one."""

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="toolrail-chaos-")))
    workers: int = 2
    concurrency: int = 2
    visibility_timeout_s: int = 10
    redis_server: EmbeddedRedis | None = None
    api_port: int = 0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    api_proc: subprocess.Popen | None = None
    restarts: int = 0
    #: Workers that exited on their own (Celery gives up when a pool child dies while starting) and were restarted.
    crash_restarts: int = 0

    @property
    def redis_url(self) -> str:
        assert self.redis_server is not None
        return self.redis_server.url

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.redis_url, "TOOLRAIL_DECIDER": "none", "TOOLRAIL_TOOL_MODULES": "tests.chaos.hostile_tools",
                "TOOLRAIL_LEDGER_PREFIX": LEDGER_PREFIX, "TOOLRAIL_VISIBILITY_TIMEOUT_S": str(self.visibility_timeout_s),
                "TOOLRAIL_LOG_JSON": "1", "TOOLRAIL_RATE_LIMIT_PER_S": "0", "TOOLRAIL_API_KEYS": "",
                "PYTHONPATH": str(ROOT)}

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> ChaosStack:
        self.redis_server = EmbeddedRedis(data_dir=self.workdir / "redis").start()
        client = redis.Redis.from_url(self.redis_url)
        book = Ledger(client, prefix=LEDGER_PREFIX)
        book.seed()
        book.seed({name: {"CNY": SEED_CENTS} for name in ACCOUNTS})
        for i in range(self.workers):
            self.start_worker(f"w{i}")
        self.start_api()
        wait_for_workers(self.redis_url, count=self.workers, timeout_s=90)
        return self

    def start_worker(self, name: str) -> None:
        self.procs[name] = start_worker(self.redis_url, queues=QUEUES, concurrency=self.concurrency, env=self.env(),
                                        hostname=f"chaos-{name}-{free_port()}@%h", log_file=self.workdir / f"{name}.log")

    def start_api(self) -> None:
        self.api_port = self.api_port or free_port()
        env = {**os.environ, **self.env()}
        log = open(self.workdir / "api.log", "ab")  # noqa: SIM115 - handed to the child
        self.api_proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "tests.chaos.chaos_harness:api_factory", "--host", "127.0.0.1",
             "--port", str(self.api_port), "--log-level", "warning", "--no-access-log"],
            env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http_ok(self.api_url, timeout_s=60)

    def stop(self) -> None:
        for proc in [*self.procs.values(), self.api_proc]:
            if proc is not None and proc.poll() is None:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self.redis_server is not None:
            self.redis_server.stop()

    # -- faults ---------------------------------------------------------------

    def worker_processes(self) -> list[tuple[str, int, bool]]:
        """(worker name, pid, is_main) of every live main worker process and pool child."""
        out = []
        for name, proc in self.procs.items():
            if proc.poll() is None:
                out.append((name, proc.pid, True))
                out.extend((name, child, False) for child in children(proc.pid))
        return out

    def supervise(self) -> None:
        """Restart workers whose main process exited on its own, as a process supervisor would."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                _killpg(proc.pid, signal.SIGKILL)
                self.start_worker(name)
                self.crash_restarts += 1

    def kill_random(self, rng: random.Random, *, main_share: float = 0.3) -> tuple[str, int, bool] | None:
        """SIGKILL one worker process: a pool child, or (``main_share`` of the time) a main process."""
        self.supervise()
        processes = self.worker_processes()
        mains = [p for p in processes if p[2]]
        children = [p for p in processes if not p[2]]
        pool = mains if (rng.random() < main_share or not children) else children
        if not pool:
            return None
        name, pid, is_main = rng.choice(pool)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        if is_main:
            proc = self.procs[name]
            proc.wait(timeout=10)
            _killpg(proc.pid, signal.SIGKILL)  # the container dies with its main process: the pool goes too
            self.start_worker(name)
            self.restarts += 1
        return name, pid, is_main

    def restart_redis(self, *, down_s: float, during_outage: Any = None) -> Any:
        """``SHUTDOWN SAVE`` (data kept), stay down ``down_s``, start again on the same port."""
        assert self.redis_server is not None
        port, data_dir = self.redis_server.port, self.redis_server.data_dir
        try:
            redis.Redis.from_url(self.redis_url).shutdown(save=True)
        except redis.ConnectionError:
            pass
        if self.redis_server.process is not None:
            self.redis_server.process.wait(timeout=10)
        self.redis_server.process = None
        observed = during_outage() if during_outage else None
        remaining = down_s
        time.sleep(max(0.0, remaining))
        self.redis_server = EmbeddedRedis(data_dir=data_dir, port=port).start()
        return observed

    # -- load -----------------------------------------------------------------

    def submit_transfer(self, client: httpx.Client, rng: random.Random, *, delay_s: float = 0.2,
                        attempts: int = 60) -> Submitted | None:
        src, dst = rng.sample(ACCOUNTS, 2)
        cents = rng.randint(1, 50_000)
        body = {"tool_calls": [{"name": "chaos_transfer", "arguments": {"from_account": src, "to": dst,
                                                                          "amount": cents / 100, "delay_s": delay_s}}]}
        key = f"chaos-{rng.getrandbits(64):016x}"
        for _ in range(attempts):  # the client retries 503s and resets under the same key: one job
            try:
                response = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                if response.status_code in (200, 202):
                    return Submitted(response.json()["job_id"], src, dst, cents)
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        return None

    def wait_all_terminal(self, client: httpx.Client, job_ids: list[str], *, timeout_s: float) -> dict[str, dict]:
        deadline = time.monotonic() + timeout_s
        jobs: dict[str, dict] = {}
        pending = list(job_ids)
        while pending and time.monotonic() < deadline:
            still = []
            for job_id in pending:
                try:
                    job = client.get(f"/v1/jobs/{job_id}").json()
                except (httpx.HTTPError, json.JSONDecodeError):
                    still.append(job_id)
                    continue
                jobs[job_id] = job
                if job.get("status") not in TERMINAL_JOB:
                    still.append(job_id)
            pending = still
            if pending:
                time.sleep(0.5)
        return jobs

    def balances(self) -> dict[str, int]:
        book = Ledger(redis.Redis.from_url(self.redis_url), prefix=LEDGER_PREFIX)
        return {name: book.balance(name).get("CNY", 0) for name in ACCOUNTS}

    def verify(self, submitted: list[Submitted], jobs: dict[str, dict], *, baseline: dict[str, int]) -> dict[str, Any]:
        """Every job terminal; the ledger exact against ``baseline`` (balances before the run). Returns the figures."""
        book = Ledger(redis.Redis.from_url(self.redis_url), prefix=LEDGER_PREFIX)
        applications = book.applications()
        per_key: dict[str, int] = {}
        for entry in applications:
            per_key[entry["key"]] = per_key.get(entry["key"], 0) + 1
        succeeded = [s for s in submitted if jobs.get(s.job_id, {}).get("status") == "succeeded"]
        lost = [s.job_id for s in submitted if jobs.get(s.job_id, {}).get("status") not in TERMINAL_JOB]
        applied_keys = {key.split(":", 1)[0]: n for key, n in per_key.items()}
        ours = {s.job_id for s in submitted}
        duplicated = sum(n - 1 for key, n in per_key.items() if n > 1 and key.split(":", 1)[0] in ours)
        missing = [s.job_id for s in succeeded if applied_keys.get(s.job_id, 0) == 0]
        not_succeeded = {s.job_id for s in submitted} - {s.job_id for s in succeeded}
        orphaned = [k for k in applied_keys if k in not_succeeded]
        expected = dict(baseline)
        for s in succeeded:
            expected[s.from_account] -= s.cents
            expected[s.to] += s.cents
        balances = self.balances()
        return {
            "jobs": len(submitted), "succeeded": len(succeeded), "failed": len(submitted) - len(succeeded) - len(lost),
            "lost": len(lost), "duplicated": duplicated, "missing_applications": len(missing), "orphaned": len(orphaned),
            "replays_refused_by_ledger": len(book.replays()), "balances_exact": balances == expected,
            "total_conserved": book.total("CNY") == SEED_CENTS * len(ACCOUNTS) + _demo_total("CNY"),
            "failures": sorted({(jobs[s.job_id].get("calls") or [{}])[0].get("error", {}).get("type", "?")
                                for s in submitted if s.job_id in jobs and jobs[s.job_id].get("status") == "failed"}),
            "lost_ids": lost[:5], "missing_ids": missing[:5], "orphaned_ids": orphaned[:5],
        }


def run_chaos(stack: ChaosStack, *, kills: int, kill_every_s: float, jobs_per_s: float, seed: int = 7,
              drain_timeout_s: float = 90.0, main_share: float = 0.3, log=print) -> dict[str, Any]:  # noqa: ANN001
    """Steady transfer load while killing a random worker process every ``kill_every_s``."""
    rng = random.Random(seed)
    baseline = stack.balances()
    submitted: list[Submitted] = []
    done = threading.Event()
    lock = threading.Lock()

    def load() -> None:
        load_rng = random.Random(seed + 1)
        with httpx.Client(base_url=stack.api_url, timeout=10) as client:
            next_at = time.monotonic()
            while not done.is_set():
                item = stack.submit_transfer(client, load_rng)
                if item is not None:
                    with lock:
                        submitted.append(item)
                next_at += 1 / jobs_per_s
                time.sleep(max(0.0, next_at - time.monotonic()))

    loader = threading.Thread(target=load, daemon=True)
    started = time.monotonic()
    loader.start()
    killed: list[tuple[str, int, bool]] = []
    time.sleep(kill_every_s)
    while len(killed) < kills:
        victim = stack.kill_random(rng, main_share=main_share)
        if victim is not None:
            killed.append(victim)
            if len(killed) % 10 == 0:
                log(f"  {len(killed)} kills, {len(submitted)} jobs submitted, {time.monotonic() - started:.0f} s")
        time.sleep(kill_every_s * rng.uniform(0.5, 1.5))
    done.set()
    loader.join(timeout=30)
    stack.supervise()
    load_s = time.monotonic() - started
    with httpx.Client(base_url=stack.api_url, timeout=10) as client:
        jobs = stack.wait_all_terminal(client, [s.job_id for s in submitted], timeout_s=drain_timeout_s)
    figures = stack.verify(submitted, jobs, baseline=baseline)
    figures.update({"kills": len(killed), "main_kills": sum(1 for k in killed if k[2]),
                    "pool_child_kills": sum(1 for k in killed if not k[2]), "worker_restarts": stack.restarts,
                    "worker_crash_restarts": stack.crash_restarts, "load_s": round(load_s, 1),
                    "total_s": round(time.monotonic() - started, 1)})
    return figures


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _demo_total(currency: str) -> int:
    from tools.ledger import DEMO_BALANCES  # noqa: PLC0415

    return sum(per.get(currency, 0) for per in DEMO_BALANCES.values())
