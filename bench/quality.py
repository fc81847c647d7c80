"""Decision quality: run a decider over a fixed, labelled prompt set and score its tool calls.

The rows and splits are :mod:`bench.quality_cases`, the metrics :mod:`bench.quality_scoring`. A
decider with ``decide_checked`` is scored on the calls its check lets through (``needs_review`` and
``failed`` execute none), otherwise on every call ``decide`` returns; the ``embedded`` decider runs
behind ``decider.checked.decide_checked`` (:class:`PlatformChecked`). The "1 outcome" count is read
from ``plan(request).grammar_json`` where the decider has ``plan``.

Usage::

    python -m bench.quality --decider oracle --split all      # self-check: 100 % everywhere
    python -m bench.quality --decider empty --split dev       # self-check: exact = no-call rows
    python -m bench.quality --decider embedded --split unseen
    python -m bench.quality --decider embedded --technique grammar,candidates --split holdout
    python -m bench.quality --decider mypkg.mod:make_decider --toolset orders --lang zh

``--decider`` takes a name from ``DECIDERS`` or ``module:callable``; the callable is a
factory called as ``factory(technique=name)`` (or ``factory()`` without ``--technique``)
and must return a ``decider.protocol.Decider``. A comma-separated ``--technique`` runs a
ladder: one decider per technique over the same rows, compared in one table.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python bench/quality.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quality_cases import LANGS, SPLITS, Case, load_cases
from bench.quality_schema import admitted_outcomes
from bench.quality_scoring import RowResult, grouped_summary, headline, markdown_table, score_row, tag_summary
from bench.toolsets import TOOLSETS, load_toolset
from decider.protocol import DecideRequest, Decider, Decision
from toolrail.logging import configure_logging
from tools.calls import ToolCall, call_id

__all__ = ["DECIDERS", "OUT_DIR", "TECHNIQUES", "EmptyDecider", "OracleDecider", "PlatformChecked", "main",
           "request_for", "resolve_factory", "run_cases"]

OUT_DIR = Path(__file__).resolve().parent / "out"


def request_for(case: Case) -> DecideRequest:
    """The request a decider sees: the conversation and the tool set, nothing about the answer."""
    return DecideRequest(request_id=case.id, messages=case.messages, tools=load_toolset(case.toolset))


def _admitted(decider: Any, request: DecideRequest) -> tuple[int | str | None, str | None]:
    """The outcomes the decider's compiled constraint admits for ``request`` (None without ``plan``)."""
    plan = getattr(decider, "plan", None)
    if not callable(plan):
        return None, None
    try:
        grammar = getattr(plan(request), "grammar_json", None)
    except Exception as exc:  # noqa: BLE001 - the decision reports its own failure; this only loses the count
        return None, f"plan: {type(exc).__name__}: {exc}"
    if not grammar:
        return None, None
    count = admitted_outcomes(json.loads(grammar))
    return ("inf" if math.isinf(count) else int(count)), None


#: Checked statuses whose calls never run: the job goes to review, or the decision failed.
NOT_EXECUTED = frozenset({"needs_review", "failed"})


def _as_call(call: Any) -> ToolCall | Mapping[str, Any]:
    """A call in a shape :func:`score_row` reads (``ToolCall``, a mapping, or any object with name/arguments)."""
    if isinstance(call, (ToolCall, Mapping)):
        return call
    return {"name": getattr(call, "name", None), "arguments": getattr(call, "arguments", None)}


def _decide(decider: Any, request: DecideRequest) -> tuple[list[ToolCall | Mapping[str, Any]], dict[str, Any]]:
    """The calls that would be executed, and what else the row records.

    ``decide_checked`` (when the decider has it) is the platform's check-and-re-ask loop: only
    the calls it lets through run, and a decision that ends ``needs_review`` (or ``failed``) runs
    none. Plain ``decide`` returns calls that all count as executed.
    """
    checked = getattr(decider, "decide_checked", None)
    if callable(checked):
        outcome = checked(request)
        attempts = getattr(outcome, "attempts", None)
        last = attempts[-1] if isinstance(attempts, Sequence) and attempts else None
        status = getattr(outcome, "status", None)
        calls = getattr(outcome, "tool_calls", None)
        if not isinstance(calls, list):
            calls = list(getattr(outcome, "calls", None) or ())
        return ([] if status in NOT_EXECUTED else [_as_call(c) for c in calls]), {
            "status": status,
            "attempts": len(attempts) if isinstance(attempts, Sequence) else attempts,
            "content": getattr(outcome, "content", None),
            "raw_output": getattr(last, "raw_output", None),
            "request_id": getattr(outcome, "request_id", None),
            "usage": dict(getattr(last, "usage", None) or {}),
        }
    decision = decider.decide(request)
    return list(decision.tool_calls), {"content": decision.content, "raw_output": decision.raw_output,
                                       "request_id": decision.request_id, "usage": dict(decision.usage)}


def run_cases(decider: Decider, cases: Sequence[Case], *, progress: Callable[[RowResult], None] | None = None) -> list[RowResult]:
    """Run ``decider`` over ``cases`` one at a time (batch 1) and score every row."""
    results = []
    for case in cases:
        request = request_for(case)
        admitted, plan_error = _admitted(decider, request)
        started = time.perf_counter()
        try:
            calls, extra = _decide(decider, request)
        except Exception as exc:  # a failing request is a scored row, not a crashed run
            calls, extra = [], {"error": f"{type(exc).__name__}: {exc}"}
        seconds = time.perf_counter() - started
        answered = extra.get("request_id")
        if answered is not None and answered != request.request_id:
            extra["error"] = f"decision for {answered!r}, asked {request.request_id!r}"
        result = score_row(case, calls, seconds=seconds, error=extra.get("error"), content=extra.get("content"),
                           raw_output=extra.get("raw_output"))
        result.usage, result.status, result.attempts = extra.get("usage") or {}, extra.get("status"), extra.get("attempts")
        result.admitted, result.plan_error = admitted, plan_error
        results.append(result)
        if progress is not None:
            progress(result)
    return results


class OracleDecider:
    """Answers every known case with its expected calls: every metric must read 100 %."""

    def __init__(self, cases: Iterable[Case]) -> None:
        self._expected = {case.id: case.expected_calls for case in cases}

    def decide(self, request: DecideRequest) -> Decision:
        calls = [ToolCall(id=call_id(request.request_id, i), index=i, name=c["name"], arguments=dict(c["arguments"]))
                 for i, c in enumerate(self._expected[request.request_id])]
        return Decision(request_id=request.request_id, raw_output=json.dumps([c.model_dump() for c in calls]),
                        tool_calls=calls, backend="oracle")


class EmptyDecider:
    """Never calls a tool: exact only on the rows where no call is right."""

    def decide(self, request: DecideRequest) -> Decision:
        return Decision(request_id=request.request_id, raw_output="", content="", backend="empty")


#: Named rungs of the technique ladder, as ``decider.service.DeciderConfig`` keyword overrides
#: (only the overrides, so a rung works with whatever else the config holds). The bench owns its
#: ladder; the decider carries none. Any ``field=value+field=value`` string also works
#: (``candidates=false+max_calls=2``).
TECHNIQUES: dict[str, dict[str, Any]] = {
    "grammar": {"candidates": False},  # the request's tool-call schema only: the model writes every value
    "candidates": {"candidates": True},  # the default: typed fields narrowed to the conversation's candidates
}

_ENGINES: dict[str, Any] = {}


def _parse_technique(technique: str, presets: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    if technique in presets:
        return dict(presets[technique])
    if "=" not in technique:
        raise SystemExit(f"unknown technique {technique!r}: one of {sorted(presets)} or field=value+field=value")
    overrides: dict[str, Any] = {}
    for part in technique.split("+"):
        key, _, raw = part.partition("=")
        overrides[key.strip()] = json.loads(raw.strip().lower()) if raw.strip().lower() in {"true", "false", "null"} or \
            raw.strip().lstrip("-").replace(".", "", 1).isdigit() else raw.strip()
    return overrides


class PlatformChecked:
    """A decider behind the platform's own check-and-re-ask loop: what a job would execute.

    ``decide_checked(request)`` runs ``check(decider, request)``; everything else (``decide``,
    ``plan``) is the decider's own.
    """

    def __init__(self, decider: Decider, check: Callable[..., Any]) -> None:
        self.decider = decider
        self._check = check

    def decide(self, request: DecideRequest) -> Decision:
        return self.decider.decide(request)

    def decide_checked(self, request: DecideRequest) -> Any:
        return self._check(self.decider, request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.decider, name)


def _embedded_factory(technique: str | None = None, **_: Any) -> Decider:
    """The real decider over the embedded engine, behind ``decider.checked.decide_checked`` where the
    platform has it; the engine (model weights) loads once per process."""
    service = importlib.import_module("decider.service")
    overrides = _parse_technique(technique, TECHNIQUES) if technique else {}
    profile = getattr(service, "EMBEDDED_PROFILE", None)  # the embedded default, as served
    config = dataclasses.replace(profile, **overrides) if profile is not None else service.DeciderConfig(**overrides)
    if "engine" not in _ENGINES:  # lazy, as decider.service above: torch and the weights load only for this decider
        _ENGINES["engine"] = importlib.import_module("decider.embedded").EmbeddedEngine.load()
    decider = service.EmbeddedDecider.from_engine(_ENGINES["engine"], config=config)
    try:
        check = getattr(importlib.import_module("decider.checked"), "decide_checked", None)
    except ImportError:  # a platform without the shared check loop: plain decide
        check = None
    return PlatformChecked(decider, check) if callable(check) else decider


DECIDERS: dict[str, Callable[..., Decider]] = {
    "oracle": lambda technique=None, cases=(), **_: OracleDecider(cases),
    "empty": lambda technique=None, **_: EmptyDecider(),
    "embedded": _embedded_factory,
}


def resolve_factory(name: str) -> Callable[..., Decider]:
    """A factory from ``DECIDERS`` or ``module:callable``."""
    if name in DECIDERS:
        return DECIDERS[name]
    if ":" not in name:
        raise SystemExit(f"unknown decider {name!r}: one of {sorted(DECIDERS)} or module:callable")
    module_name, attr = name.split(":", 1)
    target = getattr(importlib.import_module(module_name), attr)

    def factory(technique: str | None = None, **_: Any) -> Decider:
        return target(technique=technique) if technique else target()

    return factory


def _progress_printer(total: int) -> Callable[[RowResult], None]:
    done = [0]

    def report(result: RowResult) -> None:
        done[0] += 1
        mark = "ok " if result.exact else ("ERR" if result.error else "SE!" if result.wrong_side_effect_calls else "-- ")
        print(f"[{done[0]:3d}/{total}] {mark} {result.id:14s} {result.seconds:6.2f}s", file=sys.stderr, flush=True)

    return report


def _git_revision() -> str | None:
    """``<sha>`` or ``<sha>+dirty`` of the working tree the run measured (None outside git)."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}+dirty" if dirty else sha


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decider", default="embedded", help=f"{', '.join(DECIDERS)} or module:callable (default: embedded)")
    parser.add_argument("--technique", default=None, help="technique name(s), comma separated: a ladder")
    parser.add_argument("--split", choices=(*SPLITS, "all"), default="dev")
    parser.add_argument("--toolset", choices=sorted(TOOLSETS), default=None)
    parser.add_argument("--lang", choices=LANGS, default=None)
    parser.add_argument("--limit", type=int, default=None, help="at most n rows, mixed over tool sets")
    parser.add_argument("--ids", default=None, help="only these row ids (comma separated), e.g. to rerun failures")
    parser.add_argument("--tags", action="store_true", help="also print exact match per tag")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path (default: bench/out/quality-...json)")
    parser.add_argument("--quiet", action="store_true", help="no per-row progress on stderr")
    args = parser.parse_args(argv)
    # Logs go to stderr at WARNING so the tables on stdout stay readable (TOOLRAIL_LOG_LEVEL overrides).
    configure_logging(json=False, level=os.environ.get("TOOLRAIL_LOG_LEVEL", "WARNING"))

    cases = load_cases(split=args.split, toolset=args.toolset, lang=args.lang, limit=None if args.ids else args.limit)
    if args.ids:
        wanted = {i.strip() for i in args.ids.split(",")}
        cases = [c for c in cases if c.id in wanted][: args.limit]
    if not cases:
        raise SystemExit("no rows match the filters")
    factory = resolve_factory(args.decider)
    techniques: list[str | None] = [t.strip() for t in args.technique.split(",")] if args.technique else [None]
    report: dict[str, Any] = {"commit": _git_revision(), "decider": args.decider, "split": args.split, "toolset": args.toolset, "lang": args.lang,
                              "limit": args.limit, "rows": len(cases), "runs": []}
    ladder: dict[str, dict[str, Any]] = {}
    for technique in techniques:
        label = technique or "default"
        started = time.perf_counter()
        decider = factory(technique=technique, cases=cases)
        setup_s = time.perf_counter() - started
        results = run_cases(decider, cases, progress=None if args.quiet else _progress_printer(len(cases)))
        groups = grouped_summary(results)
        print(f"\n### {args.decider} · {label} · split={args.split} · {len(cases)} rows (setup {setup_s:.1f} s)\n")
        print(markdown_table(groups))
        if args.tags:
            print()
            print(markdown_table(tag_summary(results), first_column="tag"))
        headlines = {split: headline(groups[split], groups.get(f"{split} / follow-ups"))
                     for split in SPLITS if split in groups}
        print()
        for split, line in headlines.items():
            print(f"- {split}: {line}")
        executed = sum(r.wrong_side_effect_calls for r in results)
        print(f"- wrong side-effecting calls executed, all rows: {executed}")
        for split in (*SPLITS, "all"):
            if split in groups and (split != "all" or args.split == "all"):
                ladder[f"{label} / {split}"] = groups[split]
        report["runs"].append({"technique": technique, "setup_s": setup_s, "headlines": headlines,
                               "wrong_side_effect_calls": executed, "groups": groups, "tags": tag_summary(results),
                               "rows": [asdict(r) for r in results]})
    if len(techniques) > 1:
        print("\n### ladder\n")
        print(markdown_table(ladder, first_column="technique / split"))
    out = args.out or OUT_DIR / (f"quality-{args.decider.replace(':', '_').replace('/', '_')}-"
                                 f"{'+'.join(t or 'default' for t in techniques)}-{args.split}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, ensure_ascii=False, indent=1, default=str), encoding="utf-8")
    print(f"\nreport: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
