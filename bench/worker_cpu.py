"""CPU per sandboxed (or validate-only) job by process role, and the worker's own share of one call, this tree
against ``--compare``.

    python bench/worker_cpu.py [--row api-sandboxed|api-validate] [--jobs 200] [--rounds 3] [--calls 300] [--compare /tmp/old]
    python bench/worker_cpu.py --row api-validate --api-workers 2 --compare . --compare-api-workers 1

Two measurements, each alternating the trees round by round so that machine noise hits both alike:

- **stack**: ``bench/executor.py``'s stack (Redis, a worker pool of 2, the API) runs ``--jobs``
  ``api-sandboxed`` jobs from 16 clients; CPU per job of each role is read from ``/proc/<pid>/stat``
  (utime + stime of the process itself): the worker's main process (Celery's consumer: receive,
  ack), its pool processes (the task: slot, job record, breaker, store, the sandbox's client side;
  not the sandbox's processes, which are the fork server's children), the API, redis-server and
  the bench client. Then Redis commands and round trips per job (``redis_work``, one client).
- **in-process**: ``--calls`` calls, one after another, of what the ``run_call`` task does (the
  call pipeline of ``executor.runs.loop.run_call``, concurrency slot included) against an embedded Redis and a real
  sandbox, timed with ``time.process_time`` in that process: the worker's own CPU per call without
  Celery, and nothing else on the machine counted.

CPU read from ``/proc`` still grows when the machine is busy (caches, preemption); compare rows of
the same run, and prefer the in-process figure for the worker's code.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("worker-main", "worker-pool", "api", "redis", "bench-client")

# bench/executor.py by path: its name would shadow the executor package on sys.path
_spec = importlib.util.spec_from_file_location("bench_executor", Path(__file__).resolve().parent / "executor.py")
bench_executor = sys.modules["bench_executor"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_executor)

from executor.sandbox.linux import children  # noqa: E402 - ROOT is on sys.path once bench/executor.py is loaded

IN_PROCESS = r'''
import json, os, sys, tempfile, time, uuid
from pathlib import Path
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("TOOLRAIL_DECIDER", "none")
os.environ.setdefault("TOOLRAIL_LOG_LEVEL", "WARNING")
from toolrail.redis_embed import EmbeddedRedis
from executor.runs import loop as jobs
from executor.runtime import Runtime
from executor.store.records import CallRecord, JobRecord
from toolrail.settings import get_settings

calls = int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(data_dir=Path(tmp)) as server:
    os.environ["REDIS_URL"] = server.url  # a job's end notifies through the Celery app, which reads it
    rt = Runtime.from_settings(get_settings(), redis_url=server.url)

    def new_job():
        args = {"city": "Paris", "date": "today"}
        job = JobRecord(job_id=f"job_{uuid.uuid4().hex}", request_id=uuid.uuid4().hex, tenant="default", status="running",
                        tools=["get_weather"], client_output={"tool_calls": [{"name": "get_weather", "arguments": args}]})
        job.calls = [CallRecord(id="c0", index=0, name="get_weather", arguments=args, queue="tool.get_weather")]
        rt.store.create(job)
        return job.job_id

    def one(job_id):
        assert jobs.run_call(rt, job_id, "c0").status == "succeeded"  # its concurrency slot included

    for _ in range(20):
        one(new_job())
    ids = [new_job() for _ in range(calls)]
    started = time.process_time()
    for job_id in ids:
        one(job_id)
    print(json.dumps({"ms_per_call": 1000 * (time.process_time() - started) / calls}))
    rt.sandbox.close()
'''


def _cpu_ticks(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def stack_round(root: Path, jobs: int, clients: int, job: str = "api-sandboxed", api_workers: int = 1) -> dict:
    """One stack of the code at ``root`` (``api_workers`` API processes): CPU per job by role (ms), throughput,
    Redis work per job."""
    with bench_executor.start_stack("cpu", root, api_workers=api_workers) as stack:
        run = bench_executor.job_runners(stack)[job]
        bench_executor.run_level(run, 40, clients)  # warm: fork servers, scripts, connections
        pids = {"worker-main": [stack.worker_pid], "worker-pool": children(stack.worker_pid),
                "api": [stack.api_pid, *children(stack.api_pid)],  # an API of several processes: all of them
                "redis": [int(stack.client.info("server")["process_id"])], "bench-client": [os.getpid()]}
        before = {role: sum(map(_cpu_ticks, group)) for role, group in pids.items()}
        level = bench_executor.run_level(run, jobs, clients)
        after = {role: sum(map(_cpu_ticks, group)) for role, group in pids.items()}
        work = bench_executor.redis_work(stack, run)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    row = {role: (after[role] - before[role]) * tick_ms / jobs for role in ROLES}
    row.update(throughput=level["throughput"], errors=level["errors"], commands=work["commands"],
               round_trips=work["round_trips"])
    return row


def in_process_round(root: Path, calls: int) -> float:
    out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(root), str(calls)], capture_output=True, text=True,
                         cwd=root, env={**os.environ, "PYTHONPATH": str(root), "TOOLRAIL_DEMO_TOOLS": "get_weather"},
                         timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_call"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200, help="jobs per stack round (16 clients)")
    parser.add_argument("--calls", type=int, default=300, help="calls per in-process round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--row", default="api-sandboxed", choices=["api-sandboxed", "api-validate"],
                        help="the job the stack runs (api-validate: no worker work; the in-process round is skipped)")
    parser.add_argument("--compare", type=Path, default=None, help="a checkout of other code to run alternately")
    parser.add_argument("--api-workers", type=int, default=1, help="API processes of this tree's stack (default 1)")
    parser.add_argument("--compare-api-workers", type=int, default=None,
                        help="API processes of the --compare stack (default: --api-workers); with --compare naming "
                             "this tree, 1 against 2 API processes of the same code")
    parser.add_argument("--compare-label", default="before")
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    trees = [(args.label, ROOT)] + ([(args.compare_label, args.compare.resolve())] if args.compare else [])
    api_workers = {args.label: args.api_workers, args.compare_label: args.compare_api_workers or args.api_workers}
    stacks: dict[str, list[dict]] = {label: [] for label, _ in trees}
    inproc: dict[str, list[float]] = {label: [] for label, _ in trees}
    for n in range(args.rounds):
        for label, root in (trees if n % 2 == 0 else trees[::-1]):
            inproc[label].append(in_process_round(root, args.calls) if args.row == "api-sandboxed" else 0.0)
            stacks[label].append(stack_round(root, args.jobs, 16, args.row, api_workers[label]))
            print(f"  [{n + 1}/{args.rounds}] {label}: in-process {inproc[label][-1]:.3f} ms/call; "
                  f"{ {k: round(v, 2) for k, v in stacks[label][-1].items()} }", file=sys.stderr)
    load = os.getloadavg()
    print(f"\n### CPU per {args.row} job (medians of {args.rounds} alternating rounds, {os.cpu_count()} cores, "
          f"load average {load[0]:.2f})\n")
    cols = [*ROLES, "round_trips", "commands"]
    print("| tree | in-process worker ms/call | " + " | ".join(f"{c} ms" if c in ROLES else c for c in cols) + " | jobs/s |")
    print("| --- | ---: | " + " | ".join("---:" for _ in cols) + " | ---: |")
    medians = {}
    for label, _ in trees:
        med = {c: statistics.median(r[c] for r in stacks[label]) for c in [*cols, "throughput"]}
        med["in_process"] = statistics.median(inproc[label])
        medians[label] = med
        print(f"| {label} | {med['in_process']:.3f} | " + " | ".join(f"{med[c]:.2f}" if c in ROLES else f"{med[c]:.1f}"
                                                              for c in cols) + f" | {med['throughput']:.1f} |")
    if args.compare:
        new, old = medians[args.label], medians[args.compare_label]
        ratio = f"{new['in_process'] / old['in_process']:.2f}×" if old["in_process"] else "n/a"
        print(f"\n{args.label} / {args.compare_label}: in-process worker {ratio}, "
              + ", ".join(f"{c} {new[c] / old[c]:.2f}×" for c in ROLES if old[c]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
