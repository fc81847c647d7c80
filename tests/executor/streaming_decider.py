"""A streaming scripted decider (a test double of a decider that reports calls while decoding,
``TOOLRAIL_DECIDER=custom``, ``TOOLRAIL_DECIDER_FACTORY=tests.executor.streaming_decider:make``).

The script travels in the first user message, ``STREAM <json>``: ``{"steps": [step, ...]}``, a step
being ``{"attempts": [{"output": "<model text>", "pause_s": 1.0}, ...]}`` (one per re-ask) or
``{"text": "..."}``. Each attempt's output goes through the real stream parser in small chunks;
after each call closes, the double waits ``pause_s`` (the model writing the next call), so a test
can see calls run while the decision is still being decoded.
"""

from __future__ import annotations

import time
from typing import Any

from decider.parser import ToolCallStreamParser
from decider.protocol import DecideRequest, Decision
from tests.executor.scripted_decider import script_step

PREFIX = "STREAM "


class StreamingScriptedDecider:
    def decide(self, request: DecideRequest, *, on_call=None) -> Decision:  # noqa: ANN001 - decider protocol
        _, item = script_step(request.messages, PREFIX)
        if "attempts" not in item:
            text = str(item.get("text", ""))
            return Decision(request_id=request.request_id, raw_output=text, content=text, backend="streaming-scripted")
        attempt = item["attempts"][min(request.attempt, len(item["attempts"]) - 1)]
        closed: list[Any] = []
        parser = ToolCallStreamParser(request.request_id, attempt=request.attempt, on_call=closed.append)
        output = attempt["output"]
        for start in range(0, len(output), 4):
            parser.feed(output[start:start + 4])
            while closed:
                call = closed.pop(0)
                if on_call is not None:
                    on_call(call)
                time.sleep(float(attempt.get("pause_s", 0.0)))
        return Decision(request_id=request.request_id, raw_output=output, tool_calls=parser.finish().tool_calls,
                        backend="streaming-scripted")


def make(settings: object) -> StreamingScriptedDecider:
    return StreamingScriptedDecider()
