"""Chaos run: steady side-effecting transfer load while SIGKILLing worker processes.

    python bench/chaos.py [--kills 100] [--every 1.5] [--rate 4] [--workers 2]

A whole toolrail of its own (``tests/chaos/chaos_harness.py``: own redis-server, API,
Celery workers with a short visibility timeout). A random worker process — a pool child,
or a main process (then its whole worker is restarted) — is SIGKILLed every ``--every``
seconds. Afterwards: jobs, kills, lost, duplicated, and whether the ledger balances exactly.
Exit status 1 when anything was lost, doubled or unbalanced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.chaos_harness import ChaosStack, run_chaos  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--every", type=float, default=1.5, help="seconds between kills (jittered ±50 %%)")
    parser.add_argument("--rate", type=float, default=4.0, help="jobs submitted per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--visibility", type=int, default=10, help="visibility timeout of the chaos workers, s")
    parser.add_argument("--main-share", type=float, default=0.3, help="share of kills aimed at a main worker process")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    started = time.monotonic()
    stack = ChaosStack(workers=args.workers, concurrency=args.concurrency, visibility_timeout_s=args.visibility).start()
    print(f"stack up in {time.monotonic() - started:.1f} s (logs: {stack.workdir})")
    try:
        figures = run_chaos(stack, kills=args.kills, kill_every_s=args.every, jobs_per_s=args.rate, seed=args.seed,
                            drain_timeout_s=max(300.0, args.visibility * 30.0), main_share=args.main_share)
    finally:
        stack.stop()
    print(json.dumps(figures, indent=2))
    print(f"jobs {figures['jobs']}  kills {figures['kills']} ({figures['main_kills']} main, {figures['pool_child_kills']} pool"
          f" child, {stack.restarts} worker restarts)  lost {figures['lost']}  duplicated {figures['duplicated']}  "
          f"ledger exact {figures['balances_exact'] and figures['total_conserved'] and not figures['missing_applications']}")
    ok = (figures["lost"] == 0 and figures["duplicated"] == 0 and figures["missing_applications"] == 0
          and figures["orphaned"] == 0 and figures["balances_exact"] and figures["total_conserved"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
