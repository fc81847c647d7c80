"""A scripted decider (a test double of ``decider.protocol.Decider``, ``TOOLRAIL_DECIDER=custom``).

The run-loop tests need a decider whose choices they know in advance; the real model's are
tested in tests/e2e. The script travels in the conversation itself — the first user message is
``RUN <json>`` with ``{"steps": [...]}`` — so the double holds no state: the step it answers is
the number of assistant turns with tool calls already in the conversation. Each step is
``{"calls": [{"name", "arguments"}...]}`` or ``{"text": "..."}``; ``{results}`` in a text is
replaced by the conversation's tool messages as a JSON list ``[[tool_call_id, content], ...]``
in the order they appear. ``"sleep_s"`` makes a decision slow (and writes a marker with the
deciding process's pid, so a test can kill it mid-decision).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from decider.protocol import DecideRequest, Decision

PREFIX = "RUN "


class ScriptedDecider:
    def decide(self, request: DecideRequest) -> Decision:
        step, item = script_step(request.messages, PREFIX)
        if item.get("sleep_s"):
            marker_dir = os.environ.get("TOOLRAIL_TEST_MARKER_DIR")
            if marker_dir:
                # written whole, then renamed: a test polling for the marker never reads it empty
                marker = Path(marker_dir, f"deciding-{request.request_id}-{step}")
                partial = marker.with_name(marker.name + ".partial")
                partial.write_text(str(os.getpid()))
                partial.replace(marker)
            time.sleep(float(item["sleep_s"]))
        if "calls" in item and request.tool_choice == "none":  # the platform offered the answer only
            text = "answer only: " + str(item.get("then", ""))
            return Decision(request_id=request.request_id, raw_output=text, content=text, backend="scripted")
        if "calls" in item:
            raw = json.dumps([{"name": c["name"], "arguments": c.get("arguments", {})} for c in item["calls"]],
                             ensure_ascii=False)
            return Decision(request_id=request.request_id, raw_output=raw, backend="scripted")
        results = [[m.get("tool_call_id"), m.get("content")] for m in request.messages if m.get("role") == "tool"]
        text = str(item.get("text", "")).replace("{results}", json.dumps(results, ensure_ascii=False))
        return Decision(request_id=request.request_id, raw_output=text, content=text, backend="scripted")


def script_step(messages: list[dict[str, Any]], prefix: str) -> tuple[int, dict[str, Any]]:
    """The step being decided (assistant turns with calls so far) and its item of the ``<prefix><json>`` script in
    the first such user message; ``{"text": "(script ended)"}`` past its end."""
    script: dict[str, Any] = {}
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and content.startswith(prefix):
            script = json.loads(content[len(prefix):])
            break
    step = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    steps = script.get("steps", [])
    return step, steps[step] if step < len(steps) else {"text": "(script ended)"}


def make(settings: object) -> ScriptedDecider:
    """``TOOLRAIL_DECIDER_FACTORY=tests.executor.scripted_decider:make``."""
    return ScriptedDecider()
