"""A test double of a small model that copies the numbers it reads, and a refund tool with a side effect.

Asked "refund order A-17 by 5 dollars", a small model writes ``refund(order_id="A-17", amount_cents=5)``:
the literal 5 of the text in a cents field. This double always does that (the first order id and the
first number of the user's first message), so a test can tell the client's own call (``amount_cents=500``)
from the one the platform's model would have put in its place. ``TOOLRAIL_DECIDER=custom``,
``TOOLRAIL_DECIDER_FACTORY=tests.executor.literal_decider:make``; every decision is counted in Redis
(``literal:decisions``, on ``TOOLRAIL_LEDGER_URL``) so a test can tell whether the model was asked at all.

The module is also a tool module (``TOOLRAIL_TOOL_MODULES``): ``refund`` moves ``amount_cents`` USD
cents from the ``shop`` account to ``alice`` in the ledger, once per idempotency key (a real side effect).
"""

from __future__ import annotations

import json
import os
import re

import redis
from pydantic import BaseModel, ConfigDict, Field

from decider.protocol import DecideRequest, Decision
from tools.spec import ToolSpec

DECISIONS_KEY = "literal:decisions"
_ORDER = re.compile(r"\b([A-Z]-\d+)\b")
_NUMBER = re.compile(r"(?<![\w-])(\d+)(?![\w-])")


class RefundArgs(BaseModel):
    """Refund an order to the customer."""

    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(min_length=1, max_length=32, description="Order id", json_schema_extra={"x-grounded": True})
    amount_cents: int = Field(gt=0, le=1_000_000, description="Amount to refund, in US cents",
                              json_schema_extra={"x-grounded": True})


def refund(args: RefundArgs) -> dict:
    from tools.context import current_call  # noqa: PLC0415
    from tools.ledger import ledger_from_env  # noqa: PLC0415

    return ledger_from_env().transfer(from_account="shop", to="alice", cents=args.amount_cents, currency="USD",
                                      idempotency_key=current_call().idempotency_key)


def register(registry) -> None:  # noqa: ANN001 - the registry plug-in hook
    registry.add(ToolSpec.from_model("refund", RefundArgs, entrypoint="tests.executor.literal_decider:refund",
                                     side_effects=True, networked=True))


class LiteralDecider:
    """Calls ``refund`` with the order id and the first number of the user's first message, as written."""

    def decide(self, request: DecideRequest) -> Decision:
        url = os.environ.get("TOOLRAIL_LEDGER_URL") or os.environ.get("REDIS_URL")
        if url:
            redis.Redis.from_url(url).incr(DECISIONS_KEY)
        text = next((str(m.get("content") or "") for m in request.messages if m.get("role") == "user"), "")
        order, number = _ORDER.search(text), _NUMBER.search(text)
        if any(m.get("role") == "tool" for m in request.messages) or not (order and number):
            return Decision(request_id=request.request_id, raw_output="Done.", content="Done.", backend="literal")
        raw = json.dumps([{"name": "refund", "arguments": {"order_id": order.group(1), "amount_cents": int(number.group(1))}}])
        return Decision(request_id=request.request_id, raw_output=raw, backend="literal")


def make(settings: object) -> LiteralDecider:
    """``TOOLRAIL_DECIDER_FACTORY=tests.executor.literal_decider:make``."""
    return LiteralDecider()
