"""Decision quality: run a decider over a fixed, labelled prompt set and score its tool calls.

The set lives in ``bench/data/<toolset>.jsonl``: one row per prompt with ``id``, ``group``,
``toolset``, ``lang`` (zh|en), ``split`` (dev|holdout), ``messages``, ``expected_calls``
(``[{name, arguments}]``; empty means "no call is right") and ``tags``. A row's split is a
fixed hash of its group (the zh/en twins of one scenario share a group, so a scenario is
never half in dev and half in holdout); tune on dev, report holdout, never look at it.

Metrics, per split, tool set and language:

- **exact**: the predicted calls equal the expected ones as a multiset, arguments compared
  after canonicalization (defaults filled in, ``x-aliases`` applied, strings NFKC-normalized
  and stripped, numbers compared numerically), and every predicted call is schema-valid.
  A row with no expected call is exact only when nothing is called.
- **valid**: predicted calls whose name is a tool of the set and whose arguments validate
  against its JSON Schema, over all predicted calls.
- **field acc**: expected argument values reproduced, with expected and predicted calls of
  the same tool paired to agree on the most fields; an unpaired expected call scores 0.
- **wrong calls**: predicted calls with no expected call of the same tool to pair with
  (every call on a no-call row), over all predicted calls.
- **missed calls**: expected calls with no predicted call of the same tool, over all expected.
- **count acc**: rows where the number of calls is right.
- **s/req**: wall seconds per ``decide`` call, median and p90 (batch 1, sequential).

Usage::

    python -m bench.quality --decider oracle                 # self-check: 100 % everywhere
    python -m bench.quality --decider empty --split dev      # self-check: exact = no-call rows
    python -m bench.quality --decider embedded --split dev --limit 40
    python -m bench.quality --decider embedded --technique grammar,grounded --split holdout
    python -m bench.quality --decider mypkg.mod:make_decider --toolset orders --lang zh

``--decider`` takes a name from ``DECIDERS`` or ``module:callable``; the callable is a
factory called as ``factory(technique=name)`` (or ``factory()`` without ``--technique``)
and must return a ``decider.protocol.Decider``. A comma-separated ``--technique`` runs a
ladder: one decider per technique over the same rows, compared in one table.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import math
import os
import statistics
import sys
import time
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # ``python bench/quality.py``: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jsonschema

from bench.toolsets import TOOLSETS, load_toolset, spec_map
from decider.protocol import DecideRequest, Decider, Decision
from tools.calls import ToolCall, call_id
from tools.spec import ToolSpec

__all__ = [
    "DATA_DIR",
    "DECIDERS",
    "OUT_DIR",
    "SPLIT_SALT",
    "Case",
    "EmptyDecider",
    "OracleDecider",
    "RowResult",
    "canonical_arguments",
    "load_cases",
    "main",
    "markdown_table",
    "run_cases",
    "score_row",
    "split_of",
    "summarize",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
OUT_DIR = Path(__file__).resolve().parent / "out"
#: Part of the split hash; changing it reshuffles dev/holdout, so it never changes.
SPLIT_SALT = "toolrail-quality-v1"
HOLDOUT_PERCENT = 40
SPLITS = ("dev", "holdout")
LANGS = ("zh", "en")


def split_of(group: str) -> str:
    """``holdout`` for about 40 % of groups, ``dev`` for the rest: a fixed hash, never hand-picked."""
    digest = hashlib.sha256(f"{SPLIT_SALT}|{group}".encode()).hexdigest()
    return "holdout" if int(digest[:8], 16) % 100 < HOLDOUT_PERCENT else "dev"


# ------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Case:
    """One labelled prompt."""

    id: str
    group: str
    toolset: str
    lang: str
    split: str
    messages: list[dict[str, Any]]
    expected_calls: list[dict[str, Any]]
    tags: tuple[str, ...] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Case":
        return cls(id=row["id"], group=row["group"], toolset=row["toolset"], lang=row["lang"], split=row["split"],
                   messages=list(row["messages"]), expected_calls=list(row["expected_calls"]),
                   tags=tuple(row.get("tags", ())))


def load_cases(*, split: str = "all", toolset: str | None = None, lang: str | None = None, limit: int | None = None,
               data_dir: Path = DATA_DIR) -> list[Case]:
    """The labelled prompts, filtered; ``limit`` keeps the first n per (tool set, split) so a short run stays mixed."""
    cases: list[Case] = []
    for path in sorted(data_dir.glob("*.jsonl")):
        with path.open(encoding="utf-8") as handle:
            cases.extend(Case.from_row(json.loads(line)) for line in handle if line.strip())
    if split != "all":
        cases = [c for c in cases if c.split == split]
    if toolset:
        cases = [c for c in cases if c.toolset == toolset]
    if lang:
        cases = [c for c in cases if c.lang == lang]
    if limit is not None:
        # Round-robin over (tool set, split) buckets, zh/en twins kept next to each other.
        buckets: dict[tuple[str, str], list[Case]] = defaultdict(list)
        for case in cases:
            buckets[(case.toolset, case.split)].append(case)
        interleaved = [c for row in itertools.zip_longest(*buckets.values()) for c in row if c is not None]
        cases = interleaved[:limit]
    return cases


# ------------------------------------------------------------------------------------------
# canonicalization and validation
# ------------------------------------------------------------------------------------------


def _canonical_value(value: Any, aliases: Mapping[str, str] | None) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number) and number == int(number):
            return int(number)
        return round(number, 9)
    if isinstance(value, str):
        text = unicodedata.normalize("NFKC", value).strip()
        if aliases:
            if text in aliases:
                return aliases[text]
            folded = text.casefold()
            for alias, canonical in aliases.items():
                if folded in (alias.casefold(), canonical.casefold()):
                    return canonical
        return text
    if isinstance(value, list):
        return [_canonical_value(item, None) for item in value]
    if isinstance(value, dict):
        return {key: _canonical_value(item, None) for key, item in value.items()}
    return value


def canonical_arguments(spec: ToolSpec | None, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Arguments as the executor would see them after cleaning: defaults filled, aliases resolved, numbers unified."""
    arguments = dict(arguments or {})
    aliases = spec.field_aliases() if spec else {}
    if spec is not None:
        for name, prop in spec.parameters.get("properties", {}).items():
            if name not in arguments and isinstance(prop, dict) and "default" in prop:
                arguments[name] = prop["default"]
    return {name: _canonical_value(value, aliases.get(name)) for name, value in arguments.items()}


def _call_key(name: str, arguments: Mapping[str, Any]) -> str:
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def validation_errors(spec: ToolSpec, arguments: Any) -> list[str]:
    """Messages of every JSON Schema error of ``arguments`` against ``spec`` (empty when valid)."""
    if not isinstance(arguments, dict):
        return ["arguments are not a JSON object"]
    validator = _validator(json.dumps(spec.parameters, sort_keys=True))
    return [error.message for error in validator.iter_errors(arguments)]


# ------------------------------------------------------------------------------------------
# scoring
# ------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class RowResult:
    """The score of one prompt."""

    id: str
    toolset: str
    lang: str
    split: str
    tags: tuple[str, ...]
    expected: list[dict[str, Any]]
    predicted: list[dict[str, Any]]
    exact: bool
    expected_calls: int
    predicted_calls: int
    valid_calls: int
    wrong_calls: int
    missed_calls: int
    fields_total: int
    fields_correct: int
    #: ``{"tool.field": [correct, total]}``
    field_scores: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None
    content: str | None = None
    raw_output: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


def _pair_fields(expected: list[dict[str, Any]], predicted: list[dict[str, Any]]) -> list[tuple[dict, dict | None]]:
    """Pair expected with predicted calls of one tool so that the most fields agree."""
    def agreement(pairs: Iterable[tuple[dict, dict | None]]) -> int:
        return sum(1 for exp, pred in pairs if pred is not None for k, v in exp.items() if k in pred and pred[k] == v)

    slots: list[dict | None] = list(predicted) + [None] * max(0, len(expected) - len(predicted))
    if len(slots) <= 6:
        best = max((list(zip(expected, perm)) for perm in itertools.permutations(slots, len(expected))), key=agreement)
        return best
    pairs, pool = [], list(slots)  # greedy beyond 6: never reached by this data set
    for exp in expected:
        pick = max(pool, key=lambda pred: agreement([(exp, pred)]))
        pool.remove(pick)
        pairs.append((exp, pick))
    return pairs


def score_row(case: Case, predicted: Sequence[ToolCall | Mapping[str, Any]], *, specs: Mapping[str, ToolSpec] | None = None,
              seconds: float = 0.0, error: str | None = None, content: str | None = None,
              raw_output: str | None = None) -> RowResult:
    """Score one prompt's predicted calls against its expected ones (a pure function)."""
    specs = spec_map(case.toolset) if specs is None else specs
    pred_calls = [
        {"name": c.name, "arguments": c.arguments} if isinstance(c, ToolCall) else {"name": c.get("name"), "arguments": c.get("arguments")}
        for c in predicted
    ]
    valid = 0
    for call in pred_calls:
        spec = specs.get(call["name"])
        if spec is not None and not validation_errors(spec, call["arguments"]):
            valid += 1
    exp_canon = [(c["name"], canonical_arguments(specs.get(c["name"]), c["arguments"])) for c in case.expected_calls]
    # Broken arguments (not an object) get no defaults: they earn no field credit.
    pred_canon = [(c["name"], canonical_arguments(specs.get(c["name"]), c["arguments"]) if isinstance(c["arguments"], dict) else {})
                  for c in pred_calls]
    same_multiset = Counter(_call_key(n, a) for n, a in exp_canon) == Counter(_call_key(n, a) for n, a in pred_canon)
    exact = same_multiset and valid == len(pred_calls)

    exp_names, pred_names = Counter(n for n, _ in exp_canon), Counter(n for n, _ in pred_canon)
    paired_by_name = sum((exp_names & pred_names).values())
    field_scores: dict[str, list[int]] = {}
    for name in exp_names:
        pairs = _pair_fields([a for n, a in exp_canon if n == name], [a for n, a in pred_canon if n == name])
        for exp, pred in pairs:
            for key, value in exp.items():
                score = field_scores.setdefault(f"{name}.{key}", [0, 0])
                score[1] += 1
                if pred is not None and key in pred and pred[key] == value:
                    score[0] += 1
    return RowResult(
        id=case.id, toolset=case.toolset, lang=case.lang, split=case.split, tags=case.tags,
        expected=list(case.expected_calls), predicted=pred_calls, exact=exact,
        expected_calls=len(exp_canon), predicted_calls=len(pred_calls), valid_calls=valid,
        wrong_calls=len(pred_calls) - paired_by_name, missed_calls=len(exp_canon) - paired_by_name,
        fields_total=sum(t for _, t in field_scores.values()), fields_correct=sum(c for c, _ in field_scores.values()),
        field_scores=field_scores, seconds=seconds, error=error, content=content, raw_output=raw_output,
    )


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(results: Sequence[RowResult]) -> dict[str, Any]:
    """Aggregate metrics of a group of rows (ratios are None where their denominator is 0)."""
    predicted = sum(r.predicted_calls for r in results)
    expected = sum(r.expected_calls for r in results)
    fields: dict[str, list[int]] = {}
    for r in results:
        for key, (correct, total) in r.field_scores.items():
            score = fields.setdefault(key, [0, 0])
            score[0] += correct
            score[1] += total
    seconds = [r.seconds for r in results]
    return {
        "rows": len(results),
        "exact": _ratio(sum(r.exact for r in results), len(results)),
        "valid": _ratio(sum(r.valid_calls for r in results), predicted),
        "field_acc": _ratio(sum(r.fields_correct for r in results), sum(r.fields_total for r in results)),
        # No predicted call means no wrong call: 0, not undefined.
        "wrong_call_rate": (_ratio(sum(r.wrong_calls for r in results), predicted) or 0.0) if results else None,
        "missed_call_rate": _ratio(sum(r.missed_calls for r in results), expected),
        "count_acc": _ratio(sum(r.predicted_calls == r.expected_calls for r in results), len(results)),
        "no_call_rows_exact": _ratio(sum(r.exact for r in results if not r.expected_calls),
                                     sum(1 for r in results if not r.expected_calls)),
        "predicted_calls": predicted,
        "expected_calls": expected,
        "errors": sum(r.error is not None for r in results),
        "seconds_median": statistics.median(seconds) if seconds else None,
        "seconds_p90": _quantile(seconds, 0.9),
        "fields": {key: {"correct": c, "total": t, "acc": _ratio(c, t)} for key, (c, t) in sorted(fields.items())},
    }


def grouped_summary(results: Sequence[RowResult]) -> dict[str, dict[str, Any]]:
    """``{group label: summary}``: all (when both splits ran), then per split, per split × tool set and split × language."""
    groups: dict[str, list[RowResult]] = {}
    if len({r.split for r in results}) > 1:
        groups["all"] = list(results)
    for split in SPLITS:
        in_split = [r for r in results if r.split == split]
        if not in_split:
            continue
        groups[split] = in_split
        for toolset in sorted({r.toolset for r in in_split}):
            groups[f"{split} / {toolset}"] = [r for r in in_split if r.toolset == toolset]
        for lang in LANGS:
            rows = [r for r in in_split if r.lang == lang]
            if rows:
                groups[f"{split} / {lang}"] = rows
    return {label: summarize(rows) for label, rows in groups.items()}


def tag_summary(results: Sequence[RowResult]) -> dict[str, dict[str, Any]]:
    """``{"split / tag": summary}``: where a decider fails (no-call rows, parallel calls, aliases...)."""
    out: dict[str, dict[str, Any]] = {}
    for split in SPLITS:
        in_split = [r for r in results if r.split == split]
        for tag in sorted({t for r in in_split for t in r.tags}):
            out[f"{split} / {tag}"] = summarize([r for r in in_split if tag in r.tags])
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _secs(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown_table(summaries: Mapping[str, Mapping[str, Any]], *, first_column: str = "group") -> str:
    """A markdown table of summaries, one row per label."""
    header = (f"| {first_column} | n | exact | valid | field acc | wrong calls | missed calls | count acc | errors "
              "| s/req median | s/req p90 |")
    lines = [header, "|" + " --- |" * 11]
    for label, s in summaries.items():
        lines.append(
            f"| {label} | {s['rows']} | {_pct(s['exact'])} | {_pct(s['valid'])} | {_pct(s['field_acc'])} "
            f"| {_pct(s['wrong_call_rate'])} | {_pct(s['missed_call_rate'])} | {_pct(s['count_acc'])} | {s['errors']} "
            f"| {_secs(s['seconds_median'])} | {_secs(s['seconds_p90'])} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# running a decider
# ------------------------------------------------------------------------------------------


def request_for(case: Case) -> DecideRequest:
    """The request a decider sees: the conversation and the tool set, nothing about the answer."""
    return DecideRequest(request_id=case.id, messages=case.messages, tools=load_toolset(case.toolset))


def run_cases(decider: Decider, cases: Sequence[Case], *, progress: Callable[[RowResult], None] | None = None) -> list[RowResult]:
    """Run ``decider`` over ``cases`` one at a time (batch 1) and score every row."""
    results = []
    for case in cases:
        request = request_for(case)
        started = time.perf_counter()
        try:
            decision = decider.decide(request)
        except Exception as exc:  # a failing request is a scored row, not a crashed run
            elapsed = time.perf_counter() - started
            result = score_row(case, [], seconds=elapsed, error=f"{type(exc).__name__}: {exc}")
        else:
            elapsed = time.perf_counter() - started
            error = None
            if decision.request_id != request.request_id:
                error = f"decision for {decision.request_id!r}, asked {request.request_id!r}"
            result = score_row(case, decision.tool_calls, seconds=elapsed, error=error, content=decision.content,
                               raw_output=decision.raw_output)
            result.usage = dict(decision.usage)
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


DeciderFactory = Callable[..., Decider]


#: Named rungs of the technique ladder, as ``decider.service.DeciderConfig`` overrides. The
#: decider may publish its own ``TECHNIQUES`` mapping in ``decider.service``; it takes precedence.
#: Any ``field=value+field=value`` string also works (``grounding=false+allow_text=false``).
TECHNIQUES: dict[str, dict[str, Any]] = {
    "grammar": {"grounding": False},  # tool-call grammar only: the model generates every value
    "grounded": {"grounding": True},  # the decider's default: narrowing to the conversation, tools dropped
    "grounded-all": {"grounding": True, "ground_all": True},  # every string/number field grounded
    "no-text": {"grounding": True, "allow_text": False},  # the model must call a tool
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


def _embedded_factory(technique: str | None = None, **_: Any) -> Decider:
    """The real decider over the embedded engine; the engine (model weights) loads once per process."""
    service = importlib.import_module("decider.service")
    presets = {**TECHNIQUES, **getattr(service, "TECHNIQUES", {})}
    config = service.DeciderConfig(**_parse_technique(technique, presets)) if technique else service.DeciderConfig()
    if "engine" not in _ENGINES:
        from decider.embedded import EmbeddedEngine

        _ENGINES["engine"] = EmbeddedEngine.load()
    return service.EmbeddedDecider.from_engine(_ENGINES["engine"], config=config)


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
        mark = "ok " if result.exact else ("ERR" if result.error else "-- ")
        print(f"[{done[0]:3d}/{total}] {mark} {result.id:14s} {result.seconds:6.2f}s", file=sys.stderr, flush=True)

    return report


def _git_revision() -> str | None:
    """``<sha>`` or ``<sha>+dirty`` of the working tree the run measured (None outside git)."""
    import subprocess

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
    parser.add_argument("--split", choices=("dev", "holdout", "all"), default="dev")
    parser.add_argument("--toolset", choices=sorted(TOOLSETS), default=None)
    parser.add_argument("--lang", choices=LANGS, default=None)
    parser.add_argument("--limit", type=int, default=None, help="at most n rows, mixed over tool sets")
    parser.add_argument("--ids", default=None, help="only these row ids (comma separated), e.g. to rerun failures")
    parser.add_argument("--tags", action="store_true", help="also print exact match per tag")
    parser.add_argument("--out", type=Path, default=None, help="JSON report path (default: bench/out/quality-...json)")
    parser.add_argument("--quiet", action="store_true", help="no per-row progress on stderr")
    args = parser.parse_args(argv)
    from toolrail.logging import configure_logging

    # Logs go to stderr at WARNING so the tables on stdout stay readable (TOOLRAIL_LOG_LEVEL overrides).
    configure_logging(json=False, level=os.environ.get("TOOLRAIL_LOG_LEVEL", "WARNING"))

    cases = load_cases(split=args.split, toolset=args.toolset, lang=args.lang)
    if args.ids:
        wanted = {i.strip() for i in args.ids.split(",")}
        cases = [c for c in cases if c.id in wanted]
    if args.limit is not None:
        cases = load_cases(split=args.split, toolset=args.toolset, lang=args.lang, limit=args.limit) if not args.ids \
            else cases[: args.limit]
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
        for split in ("all", *SPLITS):
            if split in groups and (split != "all" or args.split == "all"):
                ladder[f"{label} / {split}"] = groups[split]
        report["runs"].append({"technique": technique, "setup_s": setup_s, "groups": groups, "tags": tag_summary(results),
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
