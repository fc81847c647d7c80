"""The Berkeley Function Calling Leaderboard's tool schemas, read from the installed ``bfcl-eval`` wheel.

Nothing of the corpus is copied here: the rows are read with :mod:`importlib.resources` from
``bfcl_eval/data`` (``make install`` puts the wheel in the venv with ``--no-deps``; its own
dependencies pin numpy 1.26 and pull sentence-transformers, faiss and torch, none of which reading
its JSON files needs).

BFCL writes its schemas in a Python-flavoured dialect (``"type": "dict"``, ``"float"``,
``"tuple"``, ``"any"``, Java's ``"HashMap"``...). toolrail does not guess at that dialect: such a
schema is refused with the JSON Pointer at fault. :func:`to_json_schema` is the documented
conversion BFCL itself applies before offering the tools to an OpenAI-style API (its
``GORILLA_TO_OPENAPI`` table, unknown names as ``string``; ``bench/bfcl.py`` applies it through
BFCL's own ``convert_to_tool``), here on every ``type`` *keyword* at any depth (a parameter named
``type`` keeps its name).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from tools.schema_walk import subschemas

__all__ = ["BfclFunction", "load_functions", "to_json_schema"]

PACKAGE = "bfcl_eval"


@dataclass(frozen=True)
class BfclFunction:
    """One distinct function of the corpus, with where it first appears."""

    category: str
    row_id: str
    function: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: The first acceptable value of each argument BFCL's possible answer gives, when it gives one.
    answer: dict[str, Any] | None = None


def _json_lines(path: Any) -> Iterator[dict[str, Any]]:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def _answers(data: Any, name: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``{row id: {function name: arguments}}`` from BFCL's possible answers (single-turn rows)."""
    path = data / "possible_answer" / name
    if not path.is_file():
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in _json_lines(path):
        calls = [c for c in row.get("ground_truth", []) if isinstance(c, dict)]  # multi-turn rows hold call strings
        for call in calls:
            for fn_name, arguments in call.items():
                picked = {arg: next((v for v in values if v != ""), None) for arg, values in arguments.items()
                          if isinstance(values, list) and any(v != "" for v in values)}
                out.setdefault(row["id"], {}).setdefault(fn_name, picked)
    return out


def _first_user_turn(question: Any) -> list[dict[str, Any]]:
    turns = question[0] if isinstance(question, list) and question and isinstance(question[0], list) else question
    return [m for m in turns or [] if isinstance(m, dict) and m.get("role") in ("user", "system")][:4] or \
        [{"role": "user", "content": "hello"}]


def load_functions() -> list[BfclFunction]:
    """Every distinct function of every category, multi-turn function docs included (first occurrence kept)."""
    data = resources.files(PACKAGE) / "data"
    seen: dict[str, BfclFunction] = {}
    for path in sorted(data.iterdir(), key=lambda p: p.name):
        if not (path.name.startswith("BFCL_") and path.name.endswith(".json")) or "format_sensitivity" in path.name:
            continue  # format_sensitivity lists row ids of other categories, no functions
        category = path.name.removeprefix("BFCL_v4_").removesuffix(".json")
        answers = _answers(data, path.name)
        for row in _json_lines(path):
            for function in row.get("function", []):
                key = json.dumps(function, sort_keys=True)
                if key not in seen:
                    seen[key] = BfclFunction(category, row["id"], function, _first_user_turn(row.get("question")),
                                             answers.get(row["id"], {}).get(function.get("name")))
    for path in sorted((data / "multi_turn_func_doc").iterdir(), key=lambda p: p.name):
        category = "multi_turn_func_doc/" + path.name.removesuffix(".json")
        for function in _json_lines(path):
            key = json.dumps(function, sort_keys=True)
            seen.setdefault(key, BfclFunction(category, category, function,
                                              [{"role": "user", "content": "Please help me with my files."}]))
    return list(seen.values())


def to_json_schema(function: dict[str, Any]) -> dict[str, Any]:
    """``function`` with BFCL's type names mapped to JSON Schema's, on ``type`` keywords only."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    function = copy.deepcopy(function)
    parameters = function.get("parameters")
    for _, node in subschemas(parameters):
        if isinstance(node.get("type"), str):
            node["type"] = GORILLA_TO_OPENAPI.get(node["type"], "string")
    return function
