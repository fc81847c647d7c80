"""Sandbox start strategies side by side: spawn-per-call, warm pre-started pool, fork server.

    python bench/sandbox.py [--calls 40]

Both run ``get_weather`` through ``ProcessSandbox`` with the same isolation (per-call uid,
Landlock, netns, rlimits); ``warm=1`` keeps one child started ahead, ``warm=0`` spawns one
per call, the fork server (the default) forks a pre-imported process per call. Calls
alternate between the three so machine noise hits all alike. Prints the median and p99
latency of each and the ratio to spawn-per-call. ``--pause 0`` measures back-to-back calls
(a warm child then has no time to finish its imports before the next call).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor.sandbox.boundary import CallRun  # noqa: E402

from executor.sandbox.process import ProcessSandbox  # noqa: E402
from tools.registry import builtin_specs  # noqa: E402


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between calls (a warm child refills meanwhile)")
    args = parser.parse_args()
    spec = next(s for s in builtin_specs() if s.name == "get_weather")
    boxes = {"spawn (warm=0)": ProcessSandbox(warm=0, forkserver=False),
             "warm pool (warm=1)": ProcessSandbox(warm=1, forkserver=False),
             "fork server (default)": ProcessSandbox()}
    times: dict[str, list[float]] = {name: [] for name in boxes}
    time.sleep(1.0)  # let the warm child finish its imports
    try:
        for i in range(args.calls + 2):
            for name, box in boxes.items():
                call = CallRun(request_id=f"bench-{i}", job_id="bench", call_id=f"c{i}", idempotency_key="k",
                               arguments={"city": "Beijing", "date": "today", "unit": "celsius"})
                started = time.perf_counter()
                box.run(spec, call)
                if i >= 2:  # first two rounds: warm-up
                    times[name].append(time.perf_counter() - started)
                time.sleep(args.pause)
    finally:
        for box in boxes.values():
            box.close()
    print(f"{'mode':<24}{'calls':>7}{'median ms':>12}{'p99 ms':>10}")
    for name, values in times.items():
        print(f"{name:<24}{len(values):>7}{statistics.median(values) * 1000:>12.1f}{p99(values) * 1000:>10.1f}")
    spawn = times["spawn (warm=0)"]
    for name, values in times.items():
        if values is not spawn:
            print(f"speed-up of {name} over spawn-per-call: median {statistics.median(spawn) / statistics.median(values):.1f}x, "
                  f"p99 {p99(spawn) / p99(values):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
