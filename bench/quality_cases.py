"""The labelled prompt set of the decision-quality bench: its rows (:class:`Case`, one per line of
``bench/data/*.jsonl``, fields in ``bench/data/README.md``) and its three splits, in report order:

- ``unseen``: five agent-style tool sets (``bench/data/unseen_*.jsonl``) written after the
  decider, never tuned on, scored once at the end: the figure that says how the decider does on
  tools and phrasings it has never seen. Reported first.
- ``holdout`` / ``dev``: the original three tool sets, split by a fixed hash of the group (the
  zh/en twins of one scenario share a group, so a scenario is never half in dev and half in
  holdout); tune on dev, report holdout, never look at it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DATA_DIR", "LANGS", "SPLITS", "SPLIT_SALT", "Case", "load_cases", "split_of"]

DATA_DIR = Path(__file__).resolve().parent / "data"
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
    #: checked by :func:`bench.quality_scoring.is_composition` instead.
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
