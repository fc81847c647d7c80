"""A tool-schema corpus nobody here wrote: every BFCL function through every stage that reads a schema.

Stages, in the order a request meets them: the client-schema limits (``check_client_schema``),
registration (``ToolSpec.from_openai``: strict mode), grammar preparation (``prepare_tool``),
bounding (``bound_free_text``), typed candidates (``narrow_tools``), the tool-call schema and
its compilation by xgrammar with the default model's tokenizer (``GrammarCache``, as the
decider compiles), then validation, cleaning and grounding of BFCL's own expected arguments.
Each function is accepted or refused with a typed error that names the JSON Pointer at fault;
any other exception is a crash, and there must be none.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval (the corpus) is a test dependency: make install")

from bfcl_corpus import BfclFunction, load_functions, to_json_schema  # noqa: E402
from decider.candidates import narrow_tools  # noqa: E402
from decider.errors import UnsupportedSchemaError  # noqa: E402
from decider.grammar import GrammarCache  # noqa: E402
from decider.model import ModelError, resolve_model_path  # noqa: E402
from decider.schema import bound_free_text, canonical_json, prepare_schema, prepare_tool, tool_calls_schema  # noqa: E402
from decider.service import DeciderConfig  # noqa: E402
from tools.cleaning import clean_value  # noqa: E402
from tools.errors import SchemaRejectedError  # noqa: E402
from tools.evidence import ConversationValues  # noqa: E402
from tools.grounding import check_grounding, grounded_paths  # noqa: E402
from tools.schema_guard import check_client_schema  # noqa: E402
from tools.spec import ToolSpec  # noqa: E402
from tools.validator import validate  # noqa: E402

CONFIG = DeciderConfig()


@pytest.fixture(scope="module")
def corpus() -> list[BfclFunction]:
    return load_functions()


@pytest.fixture(scope="module")
def grammar_cache() -> GrammarCache:
    from transformers import AutoTokenizer

    try:
        path = resolve_model_path(None, pull=False)
    except ModelError as exc:
        pytest.skip(f"the default model's tokenizer is not installed (make model): {exc}")
    return GrammarCache.for_tokenizer(AutoTokenizer.from_pretrained(path))


def _refusal_path(exc: Exception) -> str:
    """The JSON Pointer a typed refusal names ("" when it names none)."""
    if isinstance(exc, (SchemaRejectedError, UnsupportedSchemaError)):
        return exc.path
    text = str(exc)
    return text[text.index("/parameters"):].split()[0] if "/parameters" in text else ""


def run_stages(item: BfclFunction, function: dict[str, Any], cache: GrammarCache) -> str:
    """``"accepted"``, or the refusal's type and pointer; raises on anything untyped (a crash)."""
    try:
        check_client_schema(function.get("parameters", {}), path="/tools/0/function/parameters")
        spec = ToolSpec.from_openai({"type": "function", "function": function})
        prepared = prepare_tool(spec)
        grammar, _ = bound_free_text(prepared.grammar_schema, string_max=CONFIG.string_max_chars,
                                     array_max=CONFIG.array_max_items)
        narrowing = narrow_tools([spec], item.messages)
        narrowed = narrowing.parameters[spec.name]
        if narrowed is not spec.parameters:  # a narrowed copy is prepared and bounded again, as plan() does
            grammar, _ = bound_free_text(prepare_schema(narrowed).grammar_schema, string_max=CONFIG.string_max_chars,
                                         array_max=CONFIG.array_max_items)
        schema = tool_calls_schema([(spec.name, grammar)], max_calls=CONFIG.max_calls, allow_text=True,
                                   text_max_chars=CONFIG.text_max_chars)
        cache.compile(canonical_json(schema))
    except (SchemaRejectedError, UnsupportedSchemaError, ValueError) as exc:
        path = _refusal_path(exc)
        assert path, f"{item.row_id} {function.get('name')}: a refusal must name the JSON path: {exc}"
        return f"{type(exc).__name__} {getattr(exc, 'feature', '')} {path}".replace("  ", " ")
    arguments = item.answer if item.answer is not None else {}
    errors = validate(arguments, spec.parameters)
    assert isinstance(errors, list) and all(isinstance(e["path"], str) for e in errors)
    assert isinstance(prepared.errors(arguments), list)
    cleaned, _ = clean_value(arguments, spec.parameters)
    validate(cleaned, spec.parameters)
    grounded_paths(spec.parameters, side_effects=True)
    check_grounding(spec.parameters, arguments, ConversationValues.from_messages(item.messages), side_effects=True)
    return "accepted"


def _outcomes(corpus: list[BfclFunction], cache: GrammarCache, *, convert: bool) -> tuple[Counter, list[str]]:
    outcomes: Counter = Counter()
    crashes = []
    for item in corpus:
        function = to_json_schema(item.function) if convert else item.function
        try:
            outcomes[run_stages(item, function, cache)] += 1
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the point: nothing untyped may escape any stage
            crashes.append(f"{item.category} {item.row_id} {function.get('name')}: {type(exc).__name__}: {exc}"[:300])
    return outcomes, crashes


def test_the_corpus_covers_every_category(corpus):
    """Single-turn categories carry their functions; multi-turn, memory and web-search rows name function docs."""
    categories = Counter(item.category for item in corpus)
    assert len(corpus) > 3000
    for category in ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
                     "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance",
                     "live_relevance", "irrelevance"):
        assert categories[category] > 0, category
    docs = {c.removeprefix("multi_turn_func_doc/") for c in categories if c.startswith("multi_turn_func_doc/")}
    assert {"gorilla_file_system", "math_api", "memory_kv", "memory_vector", "memory_rec_sum", "message_api",
            "posting_api", "ticket_api", "trading_bot", "travel_booking", "vehicle_control", "web_search"} <= docs


@pytest.mark.slow
def test_every_bfcl_function_in_json_schema_is_accepted_or_refused_with_a_path(corpus, grammar_cache):
    outcomes, crashes = _outcomes(corpus, grammar_cache, convert=True)
    assert crashes == [], f"{len(crashes)} crashes of {len(corpus)}: " + "\n".join(crashes[:20])
    # BFCL's functions are ordinary JSON Schema once its type names are mapped: nearly all run
    assert outcomes["accepted"] >= 0.95 * len(corpus), outcomes.most_common(10)


def test_every_category_sample_is_accepted_or_refused_with_a_path(corpus, grammar_cache):
    """The fast tier: every 6th function of each category, and all multi-turn function docs."""
    by_category: dict[str, list[BfclFunction]] = {}
    for item in corpus:
        by_category.setdefault(item.category, []).append(item)
    sample = [item for category, items in by_category.items()
              for item in (items if category.startswith("multi_turn") else items[::6])]
    outcomes, crashes = _outcomes(sample, grammar_cache, convert=True)
    assert crashes == [], "\n".join(crashes[:20])
    assert outcomes["accepted"] >= 0.95 * len(sample), outcomes.most_common(10)


def test_bfcl_dialect_as_written_is_refused_with_the_pointer_at_fault(corpus, grammar_cache):
    """Unconverted (``"type": "dict"``), nothing crashes: each function is refused naming where."""
    outcomes, crashes = _outcomes(corpus, grammar_cache, convert=False)
    assert crashes == [], "\n".join(crashes[:20])
    assert outcomes["ValueError /parameters/type"] == sum(
        1 for item in corpus if item.function.get("parameters", {}).get("type", "object") != "object")
