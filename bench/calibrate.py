"""Fit the call-or-answer offset (``DeciderConfig.call_bias``) on tuning rows, and only there.

For each dev row the decider plans the request and scores both branch openings (the model's
own log-probabilities, calibrated against a content-free turn: see
``BackendDecider._choose_branch``). The row's margin is ``calls_lift - text_lift``; a row needs a
call when its expected calls are non-empty. The offset printed is the one that classifies the
most dev rows right (ties: the smallest magnitude). Holdout and unseen rows are never read.

``--bfcl-seed N`` fits on a seeded BFCL sample instead (``bench.bfcl``'s rows of simple, multiple,
live_simple: a call is right; irrelevance, live_irrelevance: none is), so the offset is decided on
one seed's rows and reported by ``bench.bfcl`` on another's.

Usage::

    python -m bench.calibrate                 # all dev rows
    python -m bench.calibrate --limit 60 --out bench/results/calibration.json
    python -m bench.calibrate --bfcl-seed 1 --rows 25
    python -m bench.bfcl --seed 1 --no-raw --set call_bias=99 --details /tmp/called.json
    python -m bench.calibrate --bfcl-seed 1 --right-if-called /tmp/called.json   # offsets by the score they give
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


def bfcl_rows(seed: int, rows: int) -> list[dict]:
    """BFCL's target categories, seeded, as calibration rows (the functions as OpenAI tools)."""
    from bench import bfcl
    from tools.spec import ToolSpec

    api = bfcl._bfcl()  # noqa: SLF001 - the bench's one way to import BFCL
    out = []
    for category in bfcl.TARGET_CATEGORIES:
        for row in bfcl.sample_rows(api, category, rows=rows, seed=seed):
            entry = row["entry"]
            tools = api.convert_to_tool(entry["function"], api.GORILLA_TO_OPENAPI, api.ModelStyle.OPENAI_COMPLETIONS)
            out.append({"id": entry["id"], "messages": entry["question"][0], "category": category,
                        "tools": [ToolSpec.from_openai(tool) for tool in tools],
                        "needs_call": "irrelevance" not in category})
    return out


OFFSET_GRID = (-2.0, -1.0, 0.0, 2.0, 4.0, 6.74)


def score_offsets(records: list[dict], details: Path) -> list[str]:
    """The BFCL target average each (offset with evidence, offset without) pair gives on these rows.

    A row that needs no call is right when the choice answers; a row that needs one is right when the
    choice calls and the call itself was right (read from ``details``, where every row was called).
    """
    saved = json.loads(details.read_text("utf-8"))
    right = {o["row_id"]: bool(o["right"]) for o in saved["rows"].get("toolrail", [])}
    lines = []
    for with_evidence in OFFSET_GRID:
        for without in OFFSET_GRID:
            hits: dict[str, list[bool]] = {}
            for r in records:
                called = r["margin"] + (with_evidence if r["evidence"] else without) >= 0
                hit = (called and right.get(r["id"], False)) if r["needs_call"] else not called
                hits.setdefault(r["category"], []).append(hit)
            average = sum(sum(h) / len(h) for h in hits.values()) / max(1, len(hits))
            lines.append(f"offset {with_evidence:+.2f} with evidence, {without:+.2f} without: "
                         f"{100 * average:.1f} % ({', '.join(f'{c} {sum(h)}/{len(h)}' for c, h in hits.items())})")
    return lines


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
    parser.add_argument("--bfcl-seed", type=int, default=None, help="fit on this seed's BFCL sample instead")
    parser.add_argument("--rows", type=int, default=25, help="BFCL rows per category (with --bfcl-seed)")
    parser.add_argument("--right-if-called", type=Path, default=None,
                        help="a bench.bfcl --details file of the same rows run with --set call_bias=99 (every row "
                             "called): score offset pairs by the BFCL target average they give")
    args = parser.parse_args(argv)
    decider = EmbeddedDecider.load(config=DeciderConfig(call_bias=0.0), num_threads=1)
    margins: list[tuple[float, bool]] = []
    records = []
    rows = dev_rows(args.limit) if args.bfcl_seed is None else bfcl_rows(args.bfcl_seed, args.rows)
    for index, row in enumerate(rows):
        tools = row["tools"] if "tools" in row else load_toolset(row["toolset"])
        request = DecideRequest(request_id=f"cal-{row['id']}", messages=row["messages"], tools=tools)
        try:
            plan = decider.plan(request)
        except Exception as exc:  # noqa: BLE001 - a row the platform refuses has no margin to fit on
            print(f"[{index + 1}] {row['id']}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
            continue
        started = time.perf_counter()
        chosen = asyncio.run(decider._choose_branch(plan)).platform.get("call_choice", {})  # noqa: SLF001
        margin = chosen.get("calls_lift", 0.0) - chosen.get("text_lift", 0.0)
        needs = row["needs_call"] if "needs_call" in row else bool(row["expected_calls"])
        margins.append((margin, needs))
        records.append({"id": row["id"], "margin": round(margin, 3), "needs_call": needs,
                        "category": row.get("category"), "evidence": bool(chosen.get("evidence")),
                        "seconds": round(time.perf_counter() - started, 2)})
        print(f"[{index + 1}] {row['id']}: margin {margin:+.2f} needs_call={needs}", file=sys.stderr, flush=True)
    offset, right = best_offset(margins)
    summary = {"rows": len(margins), "offset": round(offset, 3), "right": right,
               "accuracy": round(right / max(1, len(margins)), 3),
               "accuracy_without_offset": round(sum((m >= 0) == n for m, n in margins) / max(1, len(margins)), 3)}
    print(json.dumps(summary))
    if args.right_if_called is not None:
        for line in score_offsets(records, args.right_if_called):
            print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "margins": records}, indent=1), "utf-8")
    decider.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
