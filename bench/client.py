"""The client's-eye benchmark (issue 37): the platform as a client uses it, beside bare Celery on the same Redis.

One run, rows interleaved (``--repeat``), each for ``--seconds`` from ``--clients`` client threads:

- ``celery-noop``    a no-op Celery task, waited on with ``.get()`` (Redis result backend): the floor
- ``celery-fork``    a Celery task that forks a no-op child and waits for it: a process per call, bare
- ``api-validate``   ``POST /v1/jobs`` (``Prefer: wait=30``) with a call of an inline tool: validated, stored
- ``api-sandboxed``  ``POST /v1/jobs`` (``Prefer: wait=30``) with a ``get_weather`` call: run in the sandbox
- ``…-poll``         the same jobs waited on the way the API allowed before ``Prefer: wait`` (issue 37's
                     measurement): a plain submit, then ``GET /v1/jobs/{id}`` every 5 ms until it ends

The stack is ``toolrail serve`` as the README starts it (its own Redis, API, worker pool of
``TOOLRAIL_WORKER_CONCURRENCY`` processes), with ``TOOLRAIL_DEMO_TOOLS=get_weather`` (the sandboxed row's tool)
and ``TOOLRAIL_DECIDER=none`` (no row decides; ``--decider embedded`` loads the model anyway); the bare Celery
pool (as many processes) runs on serve's Redis. Each client thread has its own keep-alive ``httpx.Client`` and
waits the public way: the submit answers with the finished job. Every job is checked (``succeeded``).

CPU per job is what wall throughput hides on a shared machine: the CPU time of every process of serve (API,
workers, sandboxes, Redis) and of the bare Celery pool, over the row, divided by its jobs (the load generator's
own CPU apart). The load stated is the load average and the share of the machine's CPU that other processes
used during the run. Output: a table on stdout, ``bench/results/client.md``, ``bench/results/client.png``,
``bench/out/client.json``. Usage: ``python bench/client.py --clients 16 --seconds 20``.
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
from collections.abc import Callable
from pathlib import Path

from celery import Celery

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench.client"

#: The bare Celery app of the reference rows (its worker imports this module: ``-A bench.client:celery_app``).
celery_app = Celery("bench-client", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"),
                    backend=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0"))
celery_app.conf.update(task_default_queue=QUEUE, worker_prefetch_multiplier=1, result_expires=600,
                       worker_hijack_root_logger=False)


@celery_app.task(name="bench.noop")
def noop() -> None:
    """Nothing: the floor of a task round trip."""


@celery_app.task(name="bench.fork_noop")
def fork_noop() -> None:
    """Fork a no-op child and wait for it: the physical reference of one process per call."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


INLINE_TOOL = {"type": "function", "function": {"name": "echo_city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
BODIES = {"api-validate": {"tools": [INLINE_TOOL], "tool_calls": [{"name": "echo_city", "arguments": {"city": "Paris"}}]},
          "api-sandboxed": {"tools": ["get_weather"], "tool_calls": [{"name": "get_weather",
                                                                       "arguments": {"city": "Paris", "date": "today"}}]}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


class Serve:
    """``toolrail serve`` in a process group of its own; its ``export REDIS_URL=`` line read from its stdout."""

    def __init__(self, port: int, env: dict[str, str], log: Path) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "toolrail.cli", "serve", "--port", str(port)], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     start_new_session=True)
        self.redis_url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self._log.write(line)
            if line.startswith("export REDIS_URL="):
                self.redis_url = line.split("=", 1)[1].split()[0]
                self._ready.set()

    def wait(self, timeout_s: float) -> str:
        if not self._ready.wait(timeout_s) or self.redis_url is None:
            raise SystemExit(f"toolrail serve did not get ready in {timeout_s:.0f} s (log: {self._log.name})")
        return self.redis_url


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds of these processes, their live descendants and the children they reaped."""
    import psutil  # noqa: PLC0415

    total, seen = 0.0, set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            if proc.pid in seen:
                continue
            seen.add(proc.pid)
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
    return total


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s(pid: int) -> float:
    """CPU seconds of this one process (all its threads), not its children."""
    import psutil  # noqa: PLC0415

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def run_row(fn: Callable[[], bool], *, clients: int, seconds: float, server_pids: list[int], api_pid: int) -> dict:
    """``fn`` from ``clients`` threads for ``seconds``: jobs/s, latency, CPU per job (server side, the API process
    alone, client side)."""
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            ok = fn()
            elapsed = time.perf_counter() - started
            with lock:
                if ok:
                    latencies.append(elapsed)
                else:
                    errors[0] += 1

    api0, server0, client0 = own_cpu_s(api_pid), tree_cpu_s(server_pids), time.process_time()
    busy0, wall0 = machine_busy_s(), time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - wall0
    api_s, server_s, client_s = own_cpu_s(api_pid) - api0, tree_cpu_s(server_pids) - server0, time.process_time() - client0
    jobs = len(latencies)
    others = max(0.0, machine_busy_s() - busy0 - server_s - client_s)
    return {"jobs": jobs, "errors": errors[0], "seconds": round(wall, 2), "jobs_per_s": jobs / wall if wall else 0.0,
            "p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
            "p99_ms": percentile(latencies, 0.99) * 1000, "server_cpu_ms": server_s * 1000 / jobs if jobs else float("nan"),
            "api_cpu_ms": api_s * 1000 / jobs if jobs else float("nan"),
            "client_cpu_ms": client_s * 1000 / jobs if jobs else float("nan"),
            "others_cores": others / wall if wall else 0.0}


def runners(base: str) -> dict[str, Callable[[], bool]]:
    import httpx  # noqa: PLC0415

    local = threading.local()

    def http() -> httpx.Client:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=base, timeout=60)
        return client

    def job(body: dict) -> Callable[[], bool]:
        def one() -> bool:
            reply = http().post("/v1/jobs", json=body, headers={"Prefer": "wait=30"})
            return reply.status_code == 200 and reply.json().get("status") == "succeeded"
        return one

    def polled(body: dict) -> Callable[[], bool]:
        def one() -> bool:
            reply = http().post("/v1/jobs", json=body)
            if reply.status_code != 202:
                return False
            path = f"/v1/jobs/{reply.json()['job_id']}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status = http().get(path).json().get("status")
                if status in {"succeeded", "failed", "needs_review", "cancelled", "expired"}:
                    return status == "succeeded"
                time.sleep(0.005)
            return False
        return one

    def task(fn: Callable) -> Callable[[], bool]:
        def one() -> bool:
            fn.apply_async(queue=QUEUE).get(timeout=30)
            return True
        return one

    return {"celery-noop": task(noop), "celery-fork": task(fork_noop),
            "api-validate": job(BODIES["api-validate"]), "api-sandboxed": job(BODIES["api-sandboxed"]),
            "api-validate-poll": polled(BODIES["api-validate"]), "api-sandboxed-poll": polled(BODIES["api-sandboxed"])}


def median_row(runs: list[dict]) -> dict:
    keys = ("jobs_per_s", "p50_ms", "p99_ms", "server_cpu_ms", "api_cpu_ms", "client_cpu_ms", "others_cores")
    return {"jobs": sum(r["jobs"] for r in runs), "errors": sum(r["errors"] for r in runs), "runs": len(runs),
            **{k: statistics.median(r[k] for r in runs) for k in keys}}


def report(results: dict[str, dict], runs: dict[str, list[dict]], *, clients: int, seconds: float, repeat: int,
           concurrency: int, load: list, decider: str) -> str:
    """The table of the rows run, then each ratio whose two rows ran: the median of the runs' own ratios (each run
    measures the two rows within a minute of each other, so a machine that slows down for minutes moves both) with
    every run's ratio beside it."""
    others = statistics.median(r["others_cores"] for r in results.values())
    lines = [f"### client's-eye benchmark: {clients} clients, {seconds:g} s per row, median of {repeat} run(s)", "",
             f"`toolrail serve` (worker pool of {concurrency}, decider {decider}) and a bare Celery pool of {concurrency} "
             f"on serve's Redis; {os.cpu_count()} cores; load average {load[0]:.2f} before, {load[1]:.2f} after; other "
             f"processes used {others:.2f} cores during the rows (median).", "",
             "| path | jobs/s | p50 ms | p99 ms | server CPU ms/job | of it the API process | client CPU ms/job | jobs (errors) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['jobs_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['server_cpu_ms']:.2f} | {r['api_cpu_ms']:.2f} | {r['client_cpu_ms']:.2f} | {r['jobs']} ({r['errors']}) |")
    lines += ["", "| ratio | throughput | of each run | server CPU per job (reference ÷ ours: higher is better) |",
              "| --- | ---: | --- | ---: |"]
    for name, reference in (("api-validate", "celery-noop"), ("api-sandboxed", "celery-fork"),
                            ("api-validate-poll", "celery-noop"), ("api-sandboxed-poll", "celery-fork")):
        if name in runs and reference in runs:
            pairs = list(zip(runs[name], runs[reference]))
            speed = [ours["jobs_per_s"] / ref["jobs_per_s"] for ours, ref in pairs]
            cpu = [ref["server_cpu_ms"] / ours["server_cpu_ms"] for ours, ref in pairs]
            lines.append(f"| {name} ÷ {reference} | {statistics.median(speed):.2f}× | "
                         f"{', '.join(f'{x:.2f}' for x in speed)} | {statistics.median(cpu):.2f}× |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict], path: Path, title: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    palette = {"celery-noop": "#888888", "celery-fork": "#bbbbbb", "api-validate": "#1f77b4", "api-sandboxed": "#ff7f0e",
               "api-validate-poll": "#9ec5e8", "api-sandboxed-poll": "#ffc48a"}
    colors = [palette.get(n, "#555555") for n in names]
    axes[0].bar(names, [results[n]["jobs_per_s"] for n in names], color=colors)
    axes[0].set_title("jobs/s (higher is better)")
    width = 0.38
    xs = range(len(names))
    axes[1].bar([x - width / 2 for x in xs], [results[n]["p50_ms"] for n in names], width, label="p50")
    axes[1].bar([x + width / 2 for x in xs], [results[n]["p99_ms"] for n in names], width, label="p99")
    axes[1].set_xticks(list(xs), names)
    axes[1].set_title("latency ms")
    axes[1].legend()
    axes[2].bar(names, [results[n]["server_cpu_ms"] for n in names], color=colors)
    axes[2].set_title("server CPU ms per job (lower is better)")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def _py_spy(pid: int, out: Path, seconds: float) -> subprocess.Popen:
    """py-spy sampling the API process (``toolrail serve``'s own: one API process) for most of a row; the samples
    go to ``out`` as collapsed stacks, only the thread holding the GIL (CPU, not waits), and ``--nonblocking``:
    the API is never paused to be read."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--duration", str(max(1, int(seconds) - 1)),
                             "--format", "raw", "--nonblocking", "--gil", "--rate", "200", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per row and run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every row, interleaved; medians reported")
    parser.add_argument("--decider", default="none", help="TOOLRAIL_DECIDER of serve (default none: no row decides)")
    parser.add_argument("--rows", default="celery-noop,celery-fork,api-validate,api-sandboxed,api-validate-poll,"
                                          "api-sandboxed-poll")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results", help="where client.md/.png go")
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE",
                        help="py-spy the API process during each run of --profile-row: collapsed stacks to FILE")
    parser.add_argument("--profile-row", default="api-validate")
    args = parser.parse_args()

    from executor.stack import stop_process, wait_http_ok  # noqa: PLC0415
    from toolrail.redis_embed import free_port  # noqa: PLC0415

    concurrency = int(os.environ.get("TOOLRAIL_WORKER_CONCURRENCY", "2"))
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "TOOLRAIL_REDIS_URL"}}
    env.update(TOOLRAIL_DEMO_TOOLS="get_weather", TOOLRAIL_DECIDER=args.decider,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-client-") as tmp:
        serve = Serve(free_port(), env, Path(tmp) / "serve.log")
        pool = None
        try:
            url = serve.wait(600)
            wait_http_ok(serve.base, timeout_s=60)
            celery_app.conf.update(broker_url=url, result_backend=url)
            pool = subprocess.Popen([sys.executable, "-m", "celery", "-A", "bench.client:celery_app", "worker", "-Q",
                                     QUEUE, "-c", str(concurrency), "--pool", "prefork", "--without-gossip",
                                     "--without-mingle", "--loglevel", "WARNING", "-n", f"bench-client-{os.getpid()}@%h"],
                                    cwd=ROOT, env={**env, "BENCH_REDIS_URL": url}, stdout=subprocess.DEVNULL,
                                    stderr=(Path(tmp) / "celery.log").open("w"), start_new_session=True)
            rows = {name: fn for name, fn in runners(serve.base).items() if name in args.rows.split(",")}
            for fn in rows.values():  # warm-up: the first fork, the first sandbox, connections
                for _ in range(8):
                    fn()
            server_pids = [serve.proc.pid, pool.pid]
            runs: dict[str, list[dict]] = {name: [] for name in rows}
            for rep in range(args.repeat):
                for name, fn in rows.items():
                    spy = _py_spy(serve.proc.pid, args.profile, args.seconds) \
                        if args.profile and name == args.profile_row else None
                    runs[name].append(run_row(fn, clients=args.clients, seconds=args.seconds, server_pids=server_pids,
                                               api_pid=serve.proc.pid))
                    if spy is not None:
                        spy.wait(timeout=60)
                    print(f"  [{rep + 1}/{args.repeat}] {name:14s} {runs[name][-1]}", file=sys.stderr)
        finally:
            if pool is not None:
                stop_process(pool)
            stop_process(serve.proc)
    load_after = os.getloadavg()
    results = {name: median_row(r) for name, r in runs.items()}
    text = report(results, runs, clients=args.clients, seconds=args.seconds, repeat=args.repeat, concurrency=concurrency,
                  load=[load_before[0], load_after[0]], decider=args.decider)
    print(text)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "client.md").write_text(text)
    plot(results, args.results / "client.png", f"toolrail vs bare Celery, {args.clients} clients")
    out = ROOT / "bench" / "out" / "client.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results, "runs": runs, "load_average": [load_before, load_after]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
