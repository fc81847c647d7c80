"""Fit the call-or-answer offset (``DeciderConfig.call_bias``) on the dev split, and only there.

For each dev row the decider plans the request and scores both branch openings (the model's
own log-probabilities, calibrated against a content-free turn: see
``BackendDecider._choose_branch``). The row's margin is ``calls_lift - text_lift``; a row needs a
call when its expected calls are non-empty. The offset printed is the one that classifies the
most dev rows right (ties: the smallest magnitude). Holdout and unseen rows are never read.

Usage::

    python -m bench.calibrate                 # all dev rows
    python -m bench.calibrate --limit 60 --out bench/results/calibration.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.toolsets import load_toolset  # noqa: E402
from decider.protocol import DecideRequest  # noqa: E402
from decider.service import DeciderConfig, EmbeddedDecider  # noqa: E402

DATA_DIR = Path(__file__).with_name("data")


def dev_rows(limit: int | None) -> list[dict]:
    rows = []
    for path in sorted(DATA_DIR.glob("*.jsonl")):
        for line in path.read_text("utf-8").splitlines():
            row = json.loads(line)
            if row.get("split") == "dev":
                rows.append(row)
    rows.sort(key=lambda r: r["id"])
    return rows[:limit] if limit else rows


def best_offset(margins: list[tuple[float, bool]]) -> tuple[float, int]:
    """The offset that classifies the most rows right: call when ``margin + offset >= 0``."""
    candidates = sorted({-m for m, _ in margins} | {0.0})
    scored = [(sum((m + c >= 0) == needs for m, needs in margins), -abs(c), c) for c in candidates]
    right, _, offset = max(scored)
    return offset, right


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N dev rows (by id)")
    parser.add_argument("--out", type=Path, default=None, help="write margins and the fitted offset as JSON")
    args = parser.parse_args(argv)
    decider = EmbeddedDecider.load(config=DeciderConfig(call_bias=0.0))
    margins: list[tuple[float, bool]] = []
    records = []
    for index, row in enumerate(dev_rows(args.limit)):
        tools = load_toolset(row["toolset"])
        request = DecideRequest(request_id=f"cal-{row['id']}", messages=row["messages"], tools=tools)
        plan = decider.plan(request)
        started = time.perf_counter()
        chosen = asyncio.run(decider._choose_branch(plan)).platform.get("call_choice", {})  # noqa: SLF001
        margin = chosen.get("calls_lift", 0.0) - chosen.get("text_lift", 0.0)
        needs = bool(row["expected_calls"])
        margins.append((margin, needs))
        records.append({"id": row["id"], "margin": round(margin, 3), "needs_call": needs,
                        "seconds": round(time.perf_counter() - started, 2)})
        print(f"[{index + 1}] {row['id']}: margin {margin:+.2f} needs_call={needs}", file=sys.stderr, flush=True)
    offset, right = best_offset(margins)
    summary = {"rows": len(margins), "offset": round(offset, 3), "right": right,
               "accuracy": round(right / max(1, len(margins)), 3),
               "accuracy_without_offset": round(sum((m >= 0) == n for m, n in margins) / max(1, len(margins)), 3)}
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "margins": records}, indent=1), "utf-8")
    decider.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
