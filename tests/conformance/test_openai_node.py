"""openai-node (the official TypeScript/JavaScript client) against toolrail, run by node (``node/conformance.mjs``).

Optional: skipped when node or npm is missing, or when the client cannot be installed (the ``node_script`` fixture).
"""

from __future__ import annotations

import pytest

CHECKS = ["chat: streamed tool calls (id, type, name in the first delta only)",
          "chat: the stream helper (chat.completions.stream)",
          "chat: finish_reason length and usage when max_tokens cuts the answer",
          "chat: an unknown model is a 404 model_not_found",
          "responses: create with a function tool, then the tool's output by previous_response_id",
          "responses: streaming events: a function call"]


@pytest.fixture(scope="module")
def node_results(node_script, base_url) -> dict:  # noqa: ANN001 - the runner of node/'s scripts
    return node_script("conformance.mjs", {"OPENAI_BASE_URL": base_url})


@pytest.mark.parametrize("check", [pytest.param(c, marks=pytest.mark.conformance(c, "openai-node")) for c in CHECKS])
def test_openai_node(node_results, check):
    result = node_results[check]
    assert result["ok"], result["detail"]
