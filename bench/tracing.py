"""Tracing's cost: the executor pipeline with tracing off and on, side by side in one run.

Two stacks of this tree (``bench/executor.py``'s runner: one Redis, a worker pool and the API
each), identical but for ``TOOLRAIL_TRACE_STORE``: ``none`` (off: the SDK's provider is installed,
no span leaves a process) and ``memory`` (on: every process — API, workers, sandbox children —
records its spans, batch processor into an in-memory exporter; no sink's I/O is counted). The
rows of ``bench/executor.py`` (``api-validate``, ``api-sandboxed``) run at each client concurrency,
off and on interleaved, ``--repeat`` times; medians are reported with the throughput ratio. The
machine's load average is recorded before and after (a shared machine is noisy: read the ratio
of each interleaved pair, not the absolute figures); the CPU time the stack's processes spend per
job, read from ``/proc``, is the steadier figure of tracing's cost. Usage:
``python bench/tracing.py [--quick] [--levels 1,16] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_executor", ROOT / "bench" / "executor.py")
bench_executor = importlib.util.module_from_spec(_spec)  # bench/executor.py's name would shadow the executor package
sys.modules["bench_executor"] = bench_executor
_spec.loader.exec_module(bench_executor)

__all__ = ["MODES", "main"]

#: Tracing off and on, as the environment of both the API and the workers.
MODES = {"off": {"TOOLRAIL_TRACE_STORE": "none"}, "on": {"TOOLRAIL_TRACE_STORE": "memory"}}
ROWS = ("api-validate", "api-sandboxed")


def cpu_seconds(sessions: tuple[int, ...]) -> float:
    """CPU time (user + system, reaped children included) of every process in these sessions: a stack's
    API and worker pool run in sessions of their own, the sandbox children inside the worker's."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) in sessions:  # field 6 of stat: the session id
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a quarter of the jobs per level")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes per stack (default 2)")
    parser.add_argument("--levels", default="1,16")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs of every level; medians reported")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "tracing.md"))
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    scale = 0.25 if args.quick else 1.0
    load_before = os.getloadavg()
    runs: dict[tuple[str, str, int], list[dict]] = {}
    with ExitStack() as stack:
        stacks = {mode: stack.enter_context(bench_executor.start_stack(f"trace-{mode}", ROOT, workers=args.workers, env=env))
                  for mode, env in MODES.items()}
        runners = {mode: bench_executor.job_runners(s) for mode, s in stacks.items()}
        for mode in MODES:  # warm both: sandboxes, imports, connections
            for row in ROWS:
                bench_executor.run_level(runners[mode][row], 8, 4)
        for repeat in range(args.repeat):
            for level in levels:
                for row in ROWS:
                    total = max(8, int(bench_executor.ROW_SIZES[row] * scale * (1 if level > 1 else 0.25)))
                    order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))  # neither always goes first
                    for mode in order:
                        sessions = (stacks[mode].api_pid, stacks[mode].worker_pid)
                        cpu = cpu_seconds(sessions)
                        result = bench_executor.run_level(runners[mode][row], total, level)
                        result["cpu_ms_per_job"] = (cpu_seconds(sessions) - cpu) * 1000 / max(1, total - result["errors"])
                        runs.setdefault((row, mode, level), []).append(result)
                        print(f"{row:14s} c={level:<3d} tracing {mode:3s} {result['throughput']:7.1f} jobs/s  "
                              f"p50 {result['p50_ms']:7.1f} ms  p99 {result['p99_ms']:7.1f} ms  CPU {result['cpu_ms_per_job']:6.1f} ms/job  "
                              f"errors {result['errors']}",
                              flush=True)
    load_after = os.getloadavg()
    report = _report(runs, levels, args, load_before, load_after)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {f"{row}|{mode}|{level}": values for (row, mode, level), values in runs.items()}, indent=1))
    print(report)
    return 0


def _report(runs: dict, levels: list[int], args: argparse.Namespace, load_before: tuple, load_after: tuple) -> str:
    lines = [
        "# Tracing's cost: executor throughput with tracing off vs on (`bench/tracing.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores shared with other work; "
        f"load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after. Two stacks of this tree side by side, "
        f"{args.workers} worker processes each; off = `TOOLRAIL_TRACE_STORE=none`, on = `memory` (every process records "
        f"its spans, batch processor, in-memory exporter). {args.repeat} interleaved runs per cell, medians"
        f"{' (quick: a quarter of the jobs)' if args.quick else ''}.",
        "",
        "| row | clients | off jobs/s | on jobs/s | on / off | off p50 ms | on p50 ms | off p99 ms | on p99 ms | "
        "off CPU ms/job | on CPU ms/job | CPU on / off | per-run throughput ratios |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in ROWS:
        for level in levels:
            off, on = runs.get((row, "off", level), []), runs.get((row, "on", level), [])
            if not off or not on:
                continue
            med = {m: {k: statistics.median(r[k] for r in rs) for k in ("throughput", "p50_ms", "p99_ms", "cpu_ms_per_job")}
                   for m, rs in (("off", off), ("on", on))}
            pairs = [b["throughput"] / a["throughput"] for a, b in zip(off, on) if a["throughput"]]
            lines.append(f"| {row} | {level} | {med['off']['throughput']:.1f} | {med['on']['throughput']:.1f} | "
                         f"{med['on']['throughput'] / med['off']['throughput']:.3f} | {med['off']['p50_ms']:.1f} | "
                         f"{med['on']['p50_ms']:.1f} | {med['off']['p99_ms']:.1f} | {med['on']['p99_ms']:.1f} | "
                         f"{med['off']['cpu_ms_per_job']:.1f} | {med['on']['cpu_ms_per_job']:.1f} | "
                         f"{med['on']['cpu_ms_per_job'] / med['off']['cpu_ms_per_job']:.3f} | "
                         f"{', '.join(f'{p:.2f}' for p in pairs)} |")
    lines += ["", "Target: at most 5 % throughput cost at 16 clients (on / off ≥ 0.95). CPU ms/job is the CPU time the "
              "stack's processes (API, worker pool, sandbox children) spent per job, from /proc: unlike throughput it "
              "does not move with the other work on a shared machine.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
