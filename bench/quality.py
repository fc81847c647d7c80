"""Decision quality: run a decider over a fixed, labelled prompt set and score its tool calls.

The set lives in ``bench/data/*.jsonl``: one row per prompt with ``id``, ``group``, ``toolset``,
``lang`` (zh|en), ``split``, ``messages``, ``expected_calls`` (``[{name, arguments}]``; empty
means "no call is right" and a text answer is right), ``tags`` and optionally ``composed``
(``[{tool, field}]``: free-text fields the model has to write itself). Three splits:

- ``unseen``: five agent-style tool sets (``bench/data/unseen_*.jsonl``) written after the
  decider, never tuned on, scored once at the end: the figure that says how the decider does on
  tools and phrasings it has never seen. Reported first.
- ``holdout`` / ``dev``: the original three tool sets, split by a fixed hash of the group (the
  zh/en twins of one scenario share a group, so a scenario is never half in dev and half in
  holdout); tune on dev, report holdout, never look at it.

Metrics, per split, tool set and language:

- **exact**: the predicted calls equal the expected ones as a multiset, arguments compared
  after canonicalization (defaults filled in at every level, ``x-aliases`` applied, strings
  NFKC-normalized and stripped, numbers compared numerically, ``date-time`` values compared as
  instants), every predicted call is schema-valid, and composed fields pass the composition
  check instead of being compared. A row with no expected call is exact only when nothing is
  called.
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
  number that matters most. With a decider that offers ``decide_checked`` these are the calls
  its check lets through (``needs_review`` and ``failed`` execute none); otherwise every call
  ``decide`` returns counts as executed, schema-valid or not. The ``embedded`` decider runs
  behind ``decider.checked.decide_checked`` when the platform has it (:class:`PlatformChecked`).
- **needs review**: rows whose checked decision ended ``needs_review`` (``failed``, a decision
  cut at a generation bound, is counted apart in the JSON report and the headline).
- **compositions**: composed free-text fields whose predicted value is a non-empty string of at
  least 3 words (or 6 CJK characters) that is not a contiguous span of the conversation (after
  NFKC, casefolding and whitespace collapse), ``k/n``; a composed field of a tool that is not
  called fails.
- **1 outcome**: rows where the compiled constraint (``plan(request).grammar_json``) admits
  exactly one JSON value, over the rows whose constraint could be read (n/a for a decider
  without ``plan``); the row keeps the count (:func:`admitted_outcomes`).
- **s/req**: wall seconds per decision, median and p90 (batch 1, sequential).

Follow-up rows (tag ``follow_up``: an assistant tool call and its result, then the right next
call or a text answer) also get a line of their own per split.

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
import datetime as dt
import hashlib
import importlib
import itertools
import json
import math
import os
import re
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
    "SPLITS",
    "SPLIT_SALT",
    "TECHNIQUES",
    "Case",
    "EmptyDecider",
    "OracleDecider",
    "PlatformChecked",
    "RowResult",
    "admitted_outcomes",
    "canonical_arguments",
    "conversation_text",
    "is_composition",
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
#: Report order: the split nothing was tuned on first.
SPLITS = ("unseen", "holdout", "dev")
LANGS = ("zh", "en")


def split_of(group: str) -> str:
    """``holdout`` for about 40 % of the tuned set's groups, ``dev`` for the rest: a fixed hash, never hand-picked.

    Rows of the ``unseen`` split say so themselves; the hash does not place them.
    """
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
    #: ``(tool, field)`` pairs of free-text fields the model composes: never compared for equality,
    #: checked by :func:`is_composition` instead.
    composed: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Case":
        return cls(id=row["id"], group=row["group"], toolset=row["toolset"], lang=row["lang"], split=row["split"],
                   messages=list(row["messages"]), expected_calls=list(row["expected_calls"]),
                   tags=tuple(row.get("tags", ())),
                   composed=tuple((entry["tool"], entry["field"]) for entry in row.get("composed", ())))


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


def _canonical_string(text: str, schema: Mapping[str, Any]) -> str:
    text = unicodedata.normalize("NFKC", text).strip()
    aliases = schema.get("x-aliases")
    if isinstance(aliases, Mapping) and aliases:
        if text in aliases:
            return aliases[text]
        folded = text.casefold()
        for alias, canonical in aliases.items():
            if folded in (alias.casefold(), canonical.casefold()):
                return canonical
    if schema.get("format") == "date-time":
        # One instant, one spelling: 10:00:00Z == 10:00:00+00:00 == 18:00+08:00. A value without
        # an offset stays distinct from every value with one.
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            return text
        return (moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment).isoformat()
    return text


def _resolve(schema: Any, root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with a local ``$ref`` followed (one level is all pydantic writes); {} for anything else."""
    seen = 0
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and seen < 16:
        target: Any = root
        for part in schema["$ref"].removeprefix("#").strip("/").split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, Mapping) else {}
        schema, seen = target, seen + 1
    return schema if isinstance(schema, Mapping) else {}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _branch_for(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``anyOf``/``oneOf`` branch whose type fits ``value`` (a nullable field's non-null branch)."""
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            branch = _resolve(branch, root)
            types = branch.get("type")
            types = [types] if isinstance(types, str) else list(types or ())
            kind = _json_type(value)
            if not types or kind in types or (kind == "number" and "integer" in types):
                return {**{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}, **branch}
    return schema


def _canonical_value(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    schema = _branch_for(value, _resolve(schema, root), root)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isfinite(number) and number == int(number):
            return int(number)
        return round(number, 9)
    if isinstance(value, str):
        return _canonical_string(value, schema)
    if isinstance(value, list):
        items = schema.get("items")
        return [_canonical_value(item, items if isinstance(items, Mapping) else {}, root) for item in value]
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        filled = dict(value)
        for name, prop in properties.items():
            prop = _resolve(prop, root)
            if name not in filled and "default" in prop:
                filled[name] = prop["default"]
        return {key: _canonical_value(item, properties.get(key, {}), root) for key, item in filled.items()}
    return value


def canonical_arguments(spec: ToolSpec | None, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Arguments as the executor would see them after cleaning: defaults filled, aliases resolved, numbers unified.

    Driven by the spec's schema at every level (nested objects get their defaults too);
    ``date-time`` values become one spelling of their instant.
    """
    schema = spec.parameters if spec is not None else {}
    return _canonical_value(dict(arguments or {}), schema, schema)


def _call_key(name: str, arguments: Mapping[str, Any]) -> str:
    return name + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$")
#: Formats are part of validity, as in the grammar: ``date-time`` is RFC 3339 with an offset
#: (jsonschema checks it only when the optional rfc3339-validator is installed, so it is here).
_FORMATS = jsonschema.FormatChecker()


@_FORMATS.checks("date-time", raises=ValueError)
def _is_rfc3339(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    dt.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))  # a real date and time, or ValueError
    return True


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=_FORMATS)


def validation_errors(spec: ToolSpec, arguments: Any) -> list[str]:
    """Messages of every JSON Schema error of ``arguments`` against ``spec``, formats included (empty when valid)."""
    if not isinstance(arguments, dict):
        return ["arguments are not a JSON object"]
    validator = _validator(json.dumps(spec.parameters, sort_keys=True))
    return [error.message for error in validator.iter_errors(arguments)]


# ------------------------------------------------------------------------------------------
# composed free text
# ------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------
# admitted outcomes
# ------------------------------------------------------------------------------------------

_INF = float("inf")


def _times(a: int | float, b: int | float) -> int | float:
    return 0 if a == 0 or b == 0 else a * b


def admitted_outcomes(schema: Any, *, strict: bool = True) -> int | float:
    """How many distinct JSON values ``schema`` admits: an int, or ``float("inf")``.

    ``const`` admits one value, ``enum`` its members, ``boolean`` two, ``null`` one, an integer
    with both bounds its range; free strings (also under ``pattern``/``format``), unbounded
    numbers and arrays of more than zero item choices with no ``maxItems`` are infinite.
    ``anyOf``/``oneOf`` add up their branches, arrays sum ``items ** length`` (or the product of
    their ``prefixItems``) over the lengths allowed, objects multiply their properties (an
    optional one also admits being absent). Local ``$ref`` are followed; a reference cycle is
    infinite. With ``strict`` (the grammar's reading, as xgrammar compiles it) an object without
    ``additionalProperties`` admits no other keys; otherwise such an object is infinite. Branches
    that overlap are counted twice, so the count is an upper bound where they do; it is exact for
    the disjoint constraints tool-call grammars are built from.
    """
    root = schema if isinstance(schema, Mapping) else {}
    return _count(schema, root, strict, ())


def _count(schema: Any, root: Mapping[str, Any], strict: bool, refs: tuple[str, ...]) -> int | float:
    if schema is True:
        return _INF
    if schema is False:
        return 0
    if not isinstance(schema, Mapping):
        return _INF
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref in refs:
            return _INF
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        target = _resolve({"$ref": ref}, root)
        merged = {**target, **rest} if rest else target
        return _count(merged, root, strict, (*refs, ref))
    if "const" in schema:
        return 1
    if isinstance(schema.get("enum"), list):
        return len({json.dumps(v, sort_keys=True) for v in schema["enum"]})
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            base = {k: v for k, v in schema.items() if k != key}
            return sum((_count({**base, **b} if isinstance(b, Mapping) else b, root, strict, refs)
                        for b in schema[key]), start=0)
    if isinstance(schema.get("allOf"), list):
        base = {k: v for k, v in schema.items() if k != "allOf"}
        return min((_count({**base, **b} if isinstance(b, Mapping) else b, root, strict, refs)
                    for b in schema["allOf"]), default=_count(base, root, strict, refs))
    types = schema.get("type")
    if isinstance(types, list):
        return sum((_count({**schema, "type": t}, root, strict, refs) for t in types), start=0)
    if types is None:
        for implied, keys in (("object", ("properties", "required", "additionalProperties")),
                              ("array", ("items", "prefixItems", "minItems", "maxItems")),
                              ("string", ("pattern", "format", "minLength", "maxLength"))):
            if any(k in schema for k in keys):
                return _count({**schema, "type": implied}, root, strict, refs)
        return _INF
    if types == "null":
        return 1
    if types == "boolean":
        return 2
    if types == "string":
        return 1 if schema.get("maxLength") == 0 else _INF
    if types in ("integer", "number"):
        return _count_numbers(schema, integer=types == "integer")
    if types == "array":
        return _count_array(schema, root, strict, refs)
    if types == "object":
        return _count_object(schema, root, strict, refs)
    return _INF


def _count_numbers(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    low, high = schema.get("minimum"), schema.get("maximum")
    low_open, high_open = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if integer:
        first = [math.ceil(low)] if isinstance(low, (int, float)) else []
        last = [math.floor(high)] if isinstance(high, (int, float)) else []
        if isinstance(low_open, (int, float)) and not isinstance(low_open, bool):
            first.append(math.floor(low_open) + 1)
        if isinstance(high_open, (int, float)) and not isinstance(high_open, bool):
            last.append(math.ceil(high_open) - 1)
        if not first or not last:
            return _INF
        return max(0, min(last) - max(first) + 1)
    if low is not None and high is not None and low == high and low_open is None and high_open is None:
        return 1
    lows = [v for v in (low, low_open) if isinstance(v, (int, float))]
    highs = [v for v in (high, high_open) if isinstance(v, (int, float))]
    if lows and highs and max(lows) > min(highs):
        return 0
    return _INF


def _count_array(schema: Mapping[str, Any], root: Mapping[str, Any], strict: bool, refs: tuple[str, ...]) -> int | float:
    low = int(schema.get("minItems", 0))
    high = schema.get("maxItems")
    prefix = [_count(p, root, strict, refs) for p in schema.get("prefixItems") or ()]
    rest = _count(schema.get("items", True), root, strict, refs)
    # The longest array that can exist at all: up to the first position nothing fits.
    longest = next((i for i, ways in enumerate(prefix) if ways == 0), len(prefix) if rest == 0 else None)
    if longest is not None:
        high = longest if high is None else min(int(high), longest)
    if high is None:
        return _INF
    total: int | float = 0
    for length in range(low, int(high) + 1):
        ways: int | float = 1
        for position in range(length):
            ways = _times(ways, prefix[position] if position < len(prefix) else rest)
        total += ways
    return total


def _count_object(schema: Mapping[str, Any], root: Mapping[str, Any], strict: bool, refs: tuple[str, ...]) -> int | float:
    extra = schema.get("additionalProperties", not strict)
    if extra is not False and _count(extra, root, strict, refs) != 0:
        return _INF
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    if required - set(properties):
        return 0
    total: int | float = 1
    for name, prop in properties.items():
        own = _count(prop, root, strict, refs)
        total = _times(total, own if name in required else own + 1)
    return total


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
        best = max((list(zip(expected, perm)) for perm in itertools.permutations(slots, len(expected))), key=agreement)
        return best
    pairs, pool = [], list(slots)  # greedy beyond 6: never reached by this data set
    for exp in expected:
        pick = max(pool, key=lambda pred: agreement([(exp, pred)]))
        pool.remove(pick)
        pairs.append((exp, pick))
    return pairs


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


# ------------------------------------------------------------------------------------------
# running a decider
# ------------------------------------------------------------------------------------------


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
    return ("inf" if count == _INF else int(count)), None


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
            elapsed = time.perf_counter() - started
            result = score_row(case, [], seconds=elapsed, error=f"{type(exc).__name__}: {exc}")
        else:
            elapsed = time.perf_counter() - started
            error = None
            answered = extra.get("request_id")
            if answered is not None and answered != request.request_id:
                error = f"decision for {answered!r}, asked {request.request_id!r}"
            result = score_row(case, calls, seconds=elapsed, error=error, content=extra.get("content"),
                               raw_output=extra.get("raw_output"))
            result.usage = extra.get("usage") or {}
            result.status = extra.get("status")
            result.attempts = extra.get("attempts")
        result.admitted = admitted
        result.plan_error = plan_error
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
    if "engine" not in _ENGINES:
        from decider.embedded import EmbeddedEngine

        _ENGINES["engine"] = EmbeddedEngine.load()
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
    parser.add_argument("--split", choices=(*SPLITS, "all"), default="dev")
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
