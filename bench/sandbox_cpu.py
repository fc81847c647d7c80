"""CPU per sandboxed call, by process role, for this tree and (``--compare ROOT``) another checkout.

    python bench/sandbox_cpu.py [--calls 200] [--rounds 3] [--compare /tmp/old]

Each round runs ``--calls`` back-to-back ``get_weather`` calls through ``ProcessSandbox`` (fork
server, full isolation) in a fresh process per code tree, the trees alternating so that machine
noise hits both alike. CPU is sampled with ``perf record -F 4000 -g -p <bench>,<fork server>``:
perf follows every process those start, so the samples are exactly the call's processes — the
worker side (``python``), the fork server, each call's parent (a monitor, in older code), init
and tool process — and nothing else running on the machine. A sample is 0.25 ms of CPU; samples ÷ calls is the CPU one
call costs. Processes are grouped by their name (``comm``): this tree names them by role
(``tr-forkserver``, ``tr-tool``; a spawned call parent ``tr-call-parent``; the init is ``sleep``); a tree that does not name
them shows as ``python``. Kernel work done later by kernel threads (a network namespace's
teardown) is not counted. Needs ``perf`` and the rights to use it (root here); without it, only
wall time per call is printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HZ = 4000

CHILD = r'''
import json, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from executor.sandbox.boundary import CallRun
from executor.sandbox.process import ProcessSandbox
from tools.registry import builtin_specs
spec = next(s for s in builtin_specs() if s.name == "get_weather")
box = ProcessSandbox()
def call(i):
    return box.run(spec, CallRun(request_id=f"b{i}", job_id="bench", call_id=f"c{i}", idempotency_key="k",
                                 arguments={"city": "Beijing", "date": "today", "unit": "celsius"}))
for i in range(5):
    call(i)
calls, out = int(sys.argv[2]), sys.argv[3]
perf = None
if out:
    server = box._forkserver.proc.pid  # and its child, where the server made itself PID 1 of a namespace of its own
    pids = [os.getpid(), server, *open(f"/proc/{server}/task/{server}/children").read().split()]
    perf = subprocess.Popen(["perf", "record", "-q", "-F", "%d", "-g", "-p", ",".join(map(str, pids)),
                             "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
started = time.perf_counter()
for i in range(calls):
    call(i)
wall = time.perf_counter() - started
if perf is not None:
    perf.send_signal(signal.SIGINT)
    perf.wait()
box.close()
print(json.dumps({"wall_ms": wall * 1000 / calls}))
''' % HZ


def by_role(data: Path) -> collections.Counter:
    """Samples per process name in a perf data file."""
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm"], capture_output=True, text=True,
                         check=False).stdout
    return collections.Counter(line.strip() for line in out.splitlines() if line.strip())


def run(root: Path, calls: int, use_perf: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(calls), str(data) if use_perf else ""],
                              capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if use_perf:
            roles = by_role(data)
            result["cpu_ms"] = sum(roles.values()) * 1000 / HZ / calls
            result["roles"] = {name: n * 1000 / HZ / calls for name, n in roles.items()}
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", type=Path, default=None, help="a checkout of other code, run alternately")
    parser.add_argument("--compare-label", default="before")
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    use_perf = shutil.which("perf") is not None
    if not use_perf:
        print("perf not found: wall time only", file=sys.stderr)
    trees = ([(args.compare_label, args.compare.resolve())] if args.compare else []) + [(args.label, ROOT)]
    runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
    for rnd in range(args.rounds):
        for label, root in trees:
            runs[label].append(run(root, args.calls, use_perf))
            print(f"  [{rnd + 1}/{args.rounds}] {label}: {runs[label][-1].get('cpu_ms', float('nan')):.2f} ms CPU, "
                  f"{runs[label][-1]['wall_ms']:.2f} ms wall per call", file=sys.stderr)
    print(f"\n### sandbox CPU per call ({args.calls} calls × {args.rounds} rounds, median; load average "
          f"{os.getloadavg()[0]:.1f})\n")
    print("| code | CPU ms / call | wall ms / call | by process (CPU ms / call) |")
    print("| --- | ---: | ---: | --- |")
    medians = {}
    for label, rows in runs.items():
        cpu = statistics.median(r.get("cpu_ms", float("nan")) for r in rows)
        medians[label] = cpu
        roles: dict[str, list[float]] = collections.defaultdict(list)
        for r in rows:
            for name, ms in r.get("roles", {}).items():
                roles[name].append(ms)
        parts = ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in
                          sorted(roles.items(), key=lambda kv: -statistics.median(kv[1])) if statistics.median(v) >= 0.05)
        print(f"| {label} | {cpu:.2f} | {statistics.median(r['wall_ms'] for r in rows):.2f} | {parts} |")
    if args.compare and use_perf:
        print(f"\n{args.label} ÷ {args.compare_label}: {medians[args.label] / medians[args.compare_label]:.2f}× the CPU per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
