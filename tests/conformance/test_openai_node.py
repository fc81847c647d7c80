"""openai-node (the official TypeScript/JavaScript client) against toolrail, run by node.

Optional: skipped when node or npm is missing, or when the client cannot be installed (no registry). The client
is installed into ``tests/conformance/node/node_modules`` (its npm cache beside it, both ignored by git) at the
version ``package-lock.json`` pins; nothing is written outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).parent / "node"
CHECKS = ["chat: streamed tool calls (id, type, name in the first delta only)",
          "chat: the stream helper (chat.completions.stream)",
          "chat: finish_reason length and usage when max_tokens cuts the answer",
          "chat: an unknown model is a 404 model_not_found",
          "responses: create with a function tool, then the tool's output by previous_response_id",
          "responses: streaming events: a function call"]


@pytest.fixture(scope="module")
def node_results(base_url) -> dict:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node / npm not installed")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        installed = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--cache", str(NODE_DIR / ".npm-cache")],
                                   cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
        if installed.returncode != 0:
            pytest.skip(f"openai-node could not be installed: {installed.stderr[-300:]}")
    run = subprocess.run([node, "conformance.mjs"], cwd=NODE_DIR, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OPENAI_BASE_URL": base_url})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", [pytest.param(c, marks=pytest.mark.conformance(c, "openai-node")) for c in CHECKS])
def test_openai_node(node_results, check):
    result = node_results[check]
    assert result["ok"], result["detail"]
