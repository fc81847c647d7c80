"""Profile the executor's API and worker processes under load (py-spy), top entries as a table.

Starts one stack (``bench/executor.py``'s :func:`start_stack`) of the code at ``--root``, drives
one row at ``--clients`` for ``--seconds``, samples the API process and the worker pool
(``py-spy record --subprocesses``) and prints each process group's top functions by own time
and by inclusive time. Usage:
``python bench/executor_profile.py [--root /tmp/old] [--row api-validate] [--seconds 20]``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# bench/executor.py by path: its name would shadow the executor package on sys.path
_spec = importlib.util.spec_from_file_location("bench_executor", Path(__file__).resolve().parent / "executor.py")
bench_executor = sys.modules["bench_executor"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_executor)
ROOT, job_runners, run_level, start_stack = (bench_executor.ROOT, bench_executor.job_runners, bench_executor.run_level,
                                             bench_executor.start_stack)

__all__ = ["main", "top_entries"]

#: Frames of the project's own code (py-spy names the file relative to a sys.path entry).
_PROJECT = tuple(f"({name}/" for name in ("executor", "decider", "tools", "toolrail"))


def top_entries(raw: Path, *, limit: int = 15) -> tuple[int, list[tuple[str, int, int]]]:
    """(samples, [(frame, own samples, inclusive samples)]) of a py-spy ``--format raw`` file, idle excluded."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    rows = [(frame, own[frame], inclusive[frame]) for frame, _ in own.most_common(limit)]
    ours = [(frame, own[frame], n) for frame, n in inclusive.most_common() if any(p in frame for p in _PROJECT)][:limit]
    return total, rows + [("", 0, 0)] + ours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--row", default="api-validate", choices=["api-validate", "api-sandboxed"])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--limit", type=int, default=15)
    parser.add_argument("--all-threads", action="store_true",
                        help="sample every thread, waiting ones too (default: only the thread holding the GIL, i.e. CPU)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, start_stack("profile", args.root.resolve()) as stack:
        fn = job_runners(stack)[args.row]
        for _ in range(10):
            fn()
        outs = {name: Path(tmp) / f"{name}.txt" for name in ("api", "worker")}
        spies = [subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw", "--nonblocking",
                                   *([] if args.all_threads else ["--gil"]), "--rate",
                                   "200", "--duration", str(int(args.seconds)), "-o", str(outs[name]), "-p", str(pid),
                                   *(["--subprocesses"] if name == "worker" else [])],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for name, pid in (("api", stack.api_pid), ("worker", stack.worker_pid))]
        stop = time.monotonic() + args.seconds
        done = [0]

        def drive() -> None:
            while time.monotonic() < stop:
                done[0] += run_level(fn, args.clients * 4, args.clients)["n"]

        driver = threading.Thread(target=drive)
        driver.start()
        driver.join()
        for spy in spies:
            spy.wait(timeout=60)
        print(f"\n### profile: {args.row} at {args.clients} clients for {args.seconds:.0f} s, code {args.root} "
              f"({done[0]} jobs)\n")
        for name, out in outs.items():
            if not out.exists():
                print(f"{name}: no profile written\n")
                continue
            total, rows = top_entries(out, limit=args.limit)
            print(f"#### {name} ({total} samples, idle excluded)\n")
            print("| function | own % | inclusive % |")
            print("| --- | ---: | ---: |")
            for frame, own, inclusive in rows:
                if not frame:
                    print("| **project functions by inclusive time** | | |")
                    continue
                print(f"| `{frame[:110]}` | {100 * own / total:.1f} | {100 * inclusive / total:.1f} |")
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
