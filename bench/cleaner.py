"""Our text repair against ``json_repair.repair_json`` on the cleaning corpus, side by side.

Both run inside the same pipeline (``check_arguments`` / ``check_output``): the same strict
parse first, the same ``<tool_call>`` and OpenAI-shape extraction, the same value steps
(coercion, aliases, defaults) and the same jsonschema validation. Only the text repair
differs: ``tools.cleaning.clean_text`` or ``repair_json(text, return_objects=True)``.

Per tool, each corpus row lands in one bucket:

- **correct**: exactly the expected result (the same arguments, the same first error path and
  validator, or any rejection where the corpus expects one);
- **wrong-accepted**: accepted, but not what was expected — the dangerous bucket (a
  truncated number taken as complete, prose turned into arguments);
- **errors**: rejected although a repair was expected, or rejected for another reason
  than the expected one.

Time is the median over rows of each row's best of ``--repeat`` runs.

Usage::

    python -m bench.cleaner
    python -m bench.cleaner --repeat 5 --show-diff
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

if __package__ in (None, ""):  # ``python bench/cleaner.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json_repair
from importlib.metadata import version

from tools import check as pipeline
from tools.cleaning import clean_text
from executor.errors import CleaningError
from tools.registry import builtin_specs

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "tests" / "executor" / "data" / "cleaning_corpus.jsonl"
DEFAULT_REPEAT = 3
BUCKETS = ("correct", "wrong-accepted", "errors")

TextCleaner = Callable[[str], tuple[Any, tuple[str, ...]]]


def json_repair_text(text: str) -> tuple[Any, tuple[str, ...]]:
    """``clean_text``'s contract over ``json_repair``: a value and notes, or ``CleaningError``."""
    try:
        value = json_repair.repair_json(text, return_objects=True)
    except Exception as exc:  # noqa: BLE001 - any crash of the library is a failed repair here
        raise CleaningError(f"json_repair raised {type(exc).__name__}", errors=[{"path": "", "message": str(exc)[:200]}]) from None
    if value == "" and text.strip() not in {'""', "''"}:
        raise CleaningError("json_repair found no JSON", errors=[{"path": "", "message": "no JSON value found"}])
    return value, ("json_repair",)


CLEANERS: dict[str, TextCleaner] = {"ours": clean_text, "json-repair": json_repair_text}


@contextlib.contextmanager
def text_cleaner(cleaner: TextCleaner) -> Iterator[None]:
    """Run the pipeline with ``cleaner`` as its text repair."""
    with mock.patch.object(pipeline, "clean_text", cleaner):
        yield


def load_corpus(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        for placeholder, (unit, count) in row.get("expand", {}).items():
            row["raw"] = row["raw"].replace(placeholder, unit * count)
    return rows


def _exact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v) for v in value]
    return (type(value).__name__, value)


def run_row(row: dict[str, Any], specs: dict[str, Any]) -> tuple[list[tuple[str, Any]], list[dict[str, Any]]]:
    """(calls as (name, arguments), errors) of one row through the pipeline."""
    if row["level"] == "arguments":
        call = pipeline.check_arguments(specs[row["tool"]], row["raw"])
        return [(call.name, call.arguments)], list(call.errors)
    check = pipeline.check_output(row["raw"], specs)
    return [(c.name, c.arguments) for c in check.calls], check.all_errors()


def bucket(row: dict[str, Any], calls: list[tuple[str, Any]], errors: list[dict[str, Any]]) -> str:
    expect = row["expect"]
    if not errors:
        if "calls" in expect:
            wanted = [(c["name"], _exact(c["arguments"])) for c in expect["calls"]]
        elif "arguments" in expect:
            wanted = [(row["tool"], _exact(expect["arguments"]))]
        else:
            return "wrong-accepted"
        return "correct" if [(n, _exact(a)) for n, a in calls] == wanted else "wrong-accepted"
    if "error_path" in expect:
        first = (errors[0].get("path"), errors[0].get("validator"))
        return "correct" if first == (expect["error_path"], expect["validator"]) else "errors"
    if expect.get("error"):
        return "correct"  # rejected as expected; the wording of the reason differs between libraries
    return "errors"


def measure(rows: list[dict[str, Any]], cleaner: TextCleaner, *, repeat: int) -> list[dict[str, Any]]:
    specs = {spec.name: spec for spec in builtin_specs()}
    results = []
    with text_cleaner(cleaner):
        for row in rows:
            best = float("inf")
            for _ in range(repeat):
                started = time.perf_counter()
                calls, errors = run_row(row, specs)
                best = min(best, time.perf_counter() - started)
            results.append({"id": row["id"], "tool": row["tool"], "bucket": bucket(row, calls, errors),
                            "seconds": best, "calls": calls, "errors": errors[:1]})
    return results


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_tool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        by_tool[result["tool"]].append(result)
        by_tool["all"].append(result)
    summary = {}
    for tool, items in by_tool.items():
        counts = {name: sum(1 for r in items if r["bucket"] == name) for name in BUCKETS}
        summary[tool] = {**counts, "rows": len(items), "median_us": statistics.median(r["seconds"] for r in items) * 1e6}
    return summary


def render(summaries: dict[str, dict[str, dict[str, Any]]]) -> str:
    names = list(summaries)
    header = ["tool", "rows"] + [f"{bucket_name} ({name})" for name in names for bucket_name in BUCKETS] + \
             [f"median µs ({name})" for name in names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    tools = sorted(t for t in summaries[names[0]] if t != "all") + ["all"]
    for tool in tools:
        cells = [tool, str(summaries[names[0]][tool]["rows"])]
        cells += [str(summaries[name][tool][b]) for name in names for b in BUCKETS]
        cells += [f"{summaries[name][tool]['median_us']:.0f}" for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="runs per row; the best counts")
    parser.add_argument("--show-diff", action="store_true", help="list rows where the two cleaners disagree")
    args = parser.parse_args(argv)

    rows = load_corpus(args.corpus)
    results = {name: measure(rows, cleaner, repeat=args.repeat) for name, cleaner in CLEANERS.items()}
    summaries = {name: summarize(r) for name, r in results.items()}
    print(f"cleaning corpus: {len(rows)} rows, {args.corpus.name}; json-repair {version('json-repair')}\n")
    print(render(summaries))
    ours, theirs = summaries["ours"]["all"], summaries["json-repair"]["all"]
    print(f"\ncorrect: ours {ours['correct']}/{ours['rows']}, json-repair {theirs['correct']}/{theirs['rows']} "
          f"(ratio {ours['correct'] / max(theirs['correct'], 1):.2f}x); "
          f"wrong-accepted: ours {ours['wrong-accepted']}, json-repair {theirs['wrong-accepted']}; "
          f"median time ratio json-repair/ours {theirs['median_us'] / ours['median_us']:.2f}x")
    winner = "ours" if (ours["correct"], -ours["wrong-accepted"]) >= (theirs["correct"], -theirs["wrong-accepted"]) else "json-repair"
    print(f"winner on the corpus: {winner}")
    if args.show_diff:
        print("\n| row | ours | json-repair | json-repair result |\n|---|---|---|---|")
        for mine, other in zip(results["ours"], results["json-repair"]):
            if mine["bucket"] != other["bucket"]:
                shown = other["errors"][0].get("message", "")[:60] if other["errors"] else json.dumps(
                    [a for _, a in other["calls"]], ensure_ascii=False)[:60]
                print(f"| {mine['id']} | {mine['bucket']} | {other['bucket']} | {shown} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
