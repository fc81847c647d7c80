"""BFCL's real tool sets through ``POST /v1/chat/completions``: every answer a completion or a typed 4xx.

The issue this guards: a tool with a parameter named ``type`` or ``format`` made the endpoint
answer 500 (``TypeError: unhashable type: 'dict'`` in the bounding walk). The sample is every
BFCL row whose functions have a field named like a JSON Schema keyword, a few rows of each
category, and the multi-turn function docs as whole tool sets; the engine is the tiny random
model, so decoding takes milliseconds and the grammar is compiled for the default tokenizer.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
from fastapi.testclient import TestClient

pytest.importorskip("bfcl_eval", reason="bfcl-eval (the corpus) is a test dependency: make install")

from bfcl_corpus import to_json_schema  # noqa: E402
from decider.openai_api import create_app  # noqa: E402
from decider_fixtures import tiny_decider, tiny_engine  # noqa: E402, F401
from tools.schema_walk import subschemas  # noqa: E402

KEYWORD_NAMES = {"type", "format", "properties", "items", "enum", "required", "$ref", "default", "description"}


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _keyword_named(function: dict) -> bool:
    return any(set(node["properties"]) & KEYWORD_NAMES for _, node in subschemas(function.get("parameters"))
               if isinstance(node.get("properties"), dict))


def _requests(*, keyword_rows: int | None, other_rows: int = 1) -> list[tuple[str, list[dict], list[dict]]]:
    """``(label, messages, functions)``: per category ``keyword_rows`` rows (all when None) with a field
    named like a keyword and ``other_rows`` without; then each function doc file as one tool set."""
    data = resources.files("bfcl_eval") / "data"
    out = []
    for path in sorted(data.iterdir(), key=lambda p: p.name):
        if not path.name.startswith("BFCL_") or "format_sensitivity" in path.name:
            continue
        taken = {True: 0, False: 0}
        for row in _rows(path):
            functions = row.get("function") or []
            if not functions:
                continue
            keyword = any(_keyword_named(f) for f in functions)
            if taken[keyword] < (other_rows if not keyword else keyword_rows if keyword_rows is not None else 10**9):
                taken[keyword] += 1
                turns = row["question"][0] if isinstance(row["question"][0], list) else row["question"]
                out.append((row["id"], turns, functions))
    for path in sorted((data / "multi_turn_func_doc").iterdir(), key=lambda p: p.name):
        out.append((path.name, [{"role": "user", "content": "Go ahead."}], _rows(path)))
    return out


@pytest.fixture(scope="module")
def client(tiny_decider):  # noqa: F811
    with TestClient(create_app(lambda: tiny_decider)) as test_client:
        yield test_client


def _post(client: TestClient, messages: list[dict], functions: list[dict], **extra):
    tools = [{"type": "function", "function": f} for f in functions]
    return client.post("/v1/chat/completions", json={"model": "toolrail", "messages": messages, "tools": tools,
                                                     "max_tokens": 256, **extra})


def _no_server_error(client: TestClient, requests: list[tuple[str, list[dict], list[dict]]]) -> None:
    refusals: dict[str, list[str]] = {}
    for label, messages, functions in requests:
        response = _post(client, messages, [to_json_schema(f) for f in functions])
        assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:500]}"
        if response.status_code != 200:
            assert 400 <= response.status_code < 500, f"{label}: {response.status_code} {response.text[:500]}"
            refusals.setdefault(response.json()["error"]["code"], []).append(label)
    # every schema is accepted; the only refusal is a prompt longer than the tiny model's 512-token context
    assert set(refusals) <= {"context_length_exceeded"}, {kind: labels[:5] for kind, labels in refusals.items()}
    assert len(sum(refusals.values(), [])) < len(requests) / 2


def test_bfcl_tool_sets_get_no_server_error(client):
    requests = _requests(keyword_rows=2)
    assert sum(1 for _, _, functions in requests if any(_keyword_named(f) for f in functions)) >= 20
    _no_server_error(client, requests)


@pytest.mark.slow
def test_every_bfcl_row_with_keyword_named_fields_gets_no_server_error(client):
    _no_server_error(client, _requests(keyword_rows=None))


def test_bfcl_dialect_as_written_is_a_400_naming_the_pointer(client):
    label, messages, functions = next(r for r in _requests(keyword_rows=1) if any(_keyword_named(f) for f in r[2]))
    response = _post(client, messages, functions)
    assert response.status_code == 400, response.text[:500]
    assert "/parameters/type must be 'object', got 'dict'" in response.json()["error"]["message"]
