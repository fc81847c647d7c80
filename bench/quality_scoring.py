"""Scoring the quality bench: one row's calls against its labels (:func:`score_row`), summaries and tables.

Metrics, per split, tool set and language:

- **exact**: the predicted calls equal the expected ones as a multiset, arguments compared
  after canonicalization (:func:`bench.quality_schema.canonical_arguments`), every predicted
  call is schema-valid, and composed fields pass the composition check instead of being
  compared. A row with no expected call is exact only when nothing is called.
- **valid**: predicted calls whose name is a tool of the set and whose arguments validate
  against its JSON Schema, formats included (``date-time`` as RFC 3339 with an offset), over
  all predicted calls.
- **field acc**: expected argument values reproduced (composed fields left out), with expected
  and predicted calls of the same tool paired to agree on the most fields; an unpaired expected
  call scores 0.
- **wrong calls**: predicted calls with no expected call of the same tool to pair with
  (every call on a no-call row), over all predicted calls.
- **missed calls**: expected calls with no predicted call of the same tool, over all expected.
- **count acc**: rows where the number of calls is right.
- **wrong side-effect runs**: calls of a ``side_effects`` tool that would be executed and equal
  no expected call (name and canonical arguments, composed fields excepted): a count, the
  number that matters most. Which calls count as executed is the runner's to say
  (``bench.quality``: with ``decide_checked``, the calls its check lets through).
- **needs review**: rows whose checked decision ended ``needs_review`` (``failed``, a decision
  cut at a generation bound, is counted apart in the JSON report and the headline).
- **compositions**: composed free-text fields whose predicted value is a non-empty string of at
  least 3 words (or 6 CJK characters) that is not a contiguous span of the conversation (after
  NFKC, casefolding and whitespace collapse), ``k/n``; a composed field of a tool that is not
  called fails.
- **1 outcome**: rows where the compiled constraint admits exactly one JSON value, over the rows
  whose constraint could be read (n/a for a decider without ``plan``); the row keeps the count
  (:func:`bench.quality_schema.admitted_outcomes`).
- **s/req**: wall seconds per decision, median and p90 (batch 1, sequential).

Follow-up rows (tag ``follow_up``: an assistant tool call and its result, then the right next
call or a text answer) also get a line of their own per split.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.quality_cases import LANGS, SPLITS, Case
from bench.quality_schema import canonical_arguments, validation_errors
from bench.toolsets import spec_map
from tools.calls import ToolCall
from tools.spec import ToolSpec

__all__ = ["RowResult", "conversation_text", "grouped_summary", "headline", "is_composition", "markdown_table",
           "score_row", "summarize", "tag_summary"]


_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_EDGE_PUNCTUATION = " \t\n.,;:!?\"'()[]{}<>「」『』“”‘’。，、；：！？（）《》…-—"


def _folded(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Every text the decider was shown: message contents and the arguments of earlier tool calls."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            parts.append(str(function.get("arguments", "")))
    return "\n".join(parts)


def is_composition(value: Any, conversation: str) -> bool:
    """True when ``value`` is text the model wrote, not text it copied.

    A composition is a non-empty string of at least 3 words (or 6 CJK characters) that is not a
    contiguous span of ``conversation``, both compared after NFKC, casefolding and whitespace
    collapse, with the value's leading and trailing punctuation ignored.
    """
    if not isinstance(value, str):
        return False
    text = _folded(value).strip(_EDGE_PUNCTUATION)
    if not text:
        return False
    if len(text.split()) < 3 and len(_CJK.findall(text)) < 6:
        return False
    return text not in _folded(conversation)


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
    #: Calls of a side-effecting tool, executed, that equal no expected call.
    wrong_side_effect_calls: int = 0
    #: One bool per composed field of the row: did the model compose it (:func:`is_composition`)?
    compositions: list[bool] = field(default_factory=list)
    #: ``{"tool.field": [correct, total]}``
    field_scores: dict[str, list[int]] = field(default_factory=dict)
    #: Values the compiled constraint admits (int, ``"inf"``), None when it could not be read.
    admitted: int | str | None = None
    #: Why the constraint could not be read (``plan`` raised); the decision is scored regardless.
    plan_error: str | None = None
    #: The checked decision's status (``calls`` | ``text`` | ``needs_review``); None from plain ``decide``.
    status: str | None = None
    attempts: int | None = None
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
        return max((list(zip(expected, perm)) for perm in itertools.permutations(slots, len(expected))), key=agreement)
    pairs, pool = [], list(slots)  # greedy beyond 6: never reached by this data set
    for exp in expected:
        pick = max(pool, key=lambda pred: agreement([(exp, pred)]))
        pool.remove(pick)
        pairs.append((exp, pick))
    return pairs


def _call_key(name: str, arguments: Mapping[str, Any]) -> str:
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _without_composed(name: str, arguments: dict[str, Any], composed: Iterable[tuple[str, str]]) -> dict[str, Any]:
    skipped = {f for tool, f in composed if tool == name}
    return {k: v for k, v in arguments.items() if k not in skipped} if skipped else arguments


def score_row(case: Case, predicted: Sequence[ToolCall | Mapping[str, Any]], *, specs: Mapping[str, ToolSpec] | None = None,
              seconds: float = 0.0, error: str | None = None, content: str | None = None,
              raw_output: str | None = None) -> RowResult:
    """Score one prompt's predicted (that is: executed) calls against its expected ones (a pure function)."""
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
    exp_canon = [(c["name"], _without_composed(c["name"], canonical_arguments(specs.get(c["name"]), c["arguments"]), case.composed))
                 for c in case.expected_calls]
    # Broken arguments (not an object) get no defaults: they earn no field credit.
    pred_canon = [(c["name"], _without_composed(c["name"], canonical_arguments(specs.get(c["name"]), c["arguments"]), case.composed)
                   if isinstance(c["arguments"], dict) else {})
                  for c in pred_calls]
    exp_keys = Counter(_call_key(n, a) for n, a in exp_canon)
    same_multiset = exp_keys == Counter(_call_key(n, a) for n, a in pred_canon)

    unmatched = Counter(exp_keys)
    wrong_side_effects = 0
    for name, arguments in pred_canon:
        key = _call_key(name, arguments)
        if unmatched[key] > 0:
            unmatched[key] -= 1
        elif name in specs and specs[name].side_effects:
            wrong_side_effects += 1

    conversation = conversation_text(case.messages)
    compositions = []
    for tool, field_name in case.composed:
        values = [c["arguments"].get(field_name) if isinstance(c["arguments"], dict) else None
                  for c in pred_calls if c["name"] == tool]
        compositions.append(bool(values) and all(is_composition(v, conversation) for v in values))
    # A composed field is judged by the composition check instead of equality.
    exact = same_multiset and valid == len(pred_calls) and all(compositions)

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
        wrong_side_effect_calls=wrong_side_effects, compositions=compositions,
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
    compositions = [ok for r in results for ok in r.compositions]
    admitted = [r.admitted for r in results if r.admitted is not None]
    return {
        "rows": len(results),
        "exact": _ratio(sum(r.exact for r in results), len(results)),
        "exact_rows": sum(r.exact for r in results),
        "valid": _ratio(sum(r.valid_calls for r in results), predicted),
        "field_acc": _ratio(sum(r.fields_correct for r in results), sum(r.fields_total for r in results)),
        # No predicted call means no wrong call: 0, not undefined.
        "wrong_call_rate": (_ratio(sum(r.wrong_calls for r in results), predicted) or 0.0) if results else None,
        "wrong_calls": sum(r.wrong_calls for r in results),
        "missed_call_rate": _ratio(sum(r.missed_calls for r in results), expected),
        "count_acc": _ratio(sum(r.predicted_calls == r.expected_calls for r in results), len(results)),
        "no_call_rows_exact": _ratio(sum(r.exact for r in results if not r.expected_calls),
                                     sum(1 for r in results if not r.expected_calls)),
        "wrong_side_effect_calls": sum(r.wrong_side_effect_calls for r in results),
        "needs_review": sum(r.status == "needs_review" for r in results),
        "failed": sum(r.status == "failed" for r in results),
        "compositions": [sum(compositions), len(compositions)],
        "admitted_rows": len(admitted),
        "admitted_one": _ratio(sum(a == 1 for a in admitted), len(admitted)),
        "admitted_finite": _ratio(sum(a != "inf" for a in admitted), len(admitted)),
        "predicted_calls": predicted,
        "expected_calls": expected,
        "errors": sum(r.error is not None for r in results),
        "seconds_median": statistics.median(seconds) if seconds else None,
        "seconds_p90": _quantile(seconds, 0.9),
        "fields": {key: {"correct": c, "total": t, "acc": _ratio(c, t)} for key, (c, t) in sorted(fields.items())},
    }


def grouped_summary(results: Sequence[RowResult]) -> dict[str, dict[str, Any]]:
    """``{group label: summary}``: per split (unseen first) the split, its follow-up rows, per tool
    set and per language; then all rows, when several splits ran."""
    groups: dict[str, list[RowResult]] = {}
    for split in SPLITS:
        in_split = [r for r in results if r.split == split]
        if not in_split:
            continue
        groups[split] = in_split
        follow_ups = [r for r in in_split if "follow_up" in r.tags]
        if follow_ups:
            groups[f"{split} / follow-ups"] = follow_ups
        for toolset in sorted({r.toolset for r in in_split}):
            groups[f"{split} / {toolset}"] = [r for r in in_split if r.toolset == toolset]
        for lang in LANGS:
            rows = [r for r in in_split if r.lang == lang]
            if rows:
                groups[f"{split} / {lang}"] = rows
    if len({r.split for r in results}) > 1:
        groups["all"] = list(results)
    return {label: summarize(rows) for label, rows in groups.items()}


def tag_summary(results: Sequence[RowResult]) -> dict[str, dict[str, Any]]:
    """``{"split / tag": summary}``: where a decider fails (no-call rows, parallel calls, aliases...)."""
    out: dict[str, dict[str, Any]] = {}
    for split in SPLITS:
        in_split = [r for r in results if r.split == split]
        for tag in sorted({t for r in in_split for t in r.tags}):
            out[f"{split} / {tag}"] = summarize([r for r in in_split if tag in r.tags])
    return out


def headline(summary: Mapping[str, Any], follow_ups: Mapping[str, Any] | None = None) -> str:
    """One line of the figures a closing note quotes, for one split."""
    composed_ok, composed_n = summary["compositions"]
    parts = [
        f"exact {_pct(summary['exact'])} ({summary['exact_rows']}/{summary['rows']})",
        f"wrong calls {_pct(summary['wrong_call_rate'])} ({summary['wrong_calls']}/{summary['predicted_calls']})",
        f"wrong side-effecting calls executed {summary['wrong_side_effect_calls']}",
        f"needs_review {summary['needs_review']}",
        *([f"failed {summary['failed']}"] if summary["failed"] else []),
        f"compositions {composed_ok}/{composed_n}",
    ]
    if follow_ups is not None:
        parts.append(f"follow-ups {follow_ups['exact_rows']}/{follow_ups['rows']}")
    parts.append("one outcome " + (f"{_pct(summary['admitted_one'])} of {summary['admitted_rows']} rows"
                                   if summary["admitted_rows"] else "n/a"))
    parts.append(f"valid {_pct(summary['valid'])}")
    return "; ".join(parts)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def _secs(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _fraction(pair: Sequence[int]) -> str:
    return f"{pair[0]}/{pair[1]}" if pair[1] else "–"


def markdown_table(summaries: Mapping[str, Mapping[str, Any]], *, first_column: str = "group") -> str:
    """A markdown table of summaries, one row per label."""
    header = (f"| {first_column} | n | exact | valid | field acc | wrong calls | missed calls | count acc "
              "| wrong side-effect runs | needs review | compositions | 1 outcome | errors | s/req median | s/req p90 |")
    lines = [header, "|" + " --- |" * 15]
    for label, s in summaries.items():
        one = _pct(s["admitted_one"]) if s["admitted_rows"] else "n/a"
        lines.append(
            f"| {label} | {s['rows']} | {_pct(s['exact'])} | {_pct(s['valid'])} | {_pct(s['field_acc'])} "
            f"| {_pct(s['wrong_call_rate'])} | {_pct(s['missed_call_rate'])} | {_pct(s['count_acc'])} "
            f"| {s['wrong_side_effect_calls']} | {s['needs_review']} | {_fraction(s['compositions'])} | {one} "
            f"| {s['errors']} | {_secs(s['seconds_median'])} | {_secs(s['seconds_p90'])} |"
        )
    return "\n".join(lines)


