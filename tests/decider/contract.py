"""The backend contract suite: every backend behind the decider must pass it.

Import it into a test module that defines a ``contract_decider`` fixture (a
:class:`decider.service.BackendDecider` over the backend under test)::

    from contract import *  # noqa: F401,F403

    @pytest.fixture(scope="module", params=["tiny"])
    def contract_decider(request, tiny_decider):
        return tiny_decider

The Triton backend's tests reuse it with their own fixture. Schemas live in ``schemas/``.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from decider.protocol import DecideRequest
from decider.schema import validation_errors
from decider_fixtures import load_schemas, marker_tools

__all__ = [
    "test_contract_interleaving_no_mixes",
    "test_contract_output_validates",
    "test_contract_parallel_calls_bound_to_request",
]

SCHEMAS = load_schemas()


@pytest.mark.parametrize(("name", "schema"), SCHEMAS, ids=[name for name, _ in SCHEMAS])
def test_contract_output_validates(contract_decider, name, schema):
    """Constrained output validates against its schema (post-decoding checks may re-ask)."""
    value, decision = contract_decider.generate_json(schema, f"Produce an example for {name}.", request_id=f"contract-{name}",
                                                     max_tokens=200, max_reasks=3)
    assert validation_errors(schema, value) == []
    assert json.loads(decision.raw_output) == value
    assert decision.request_id == f"contract-{name}"


def _marker(rng: random.Random) -> str:
    return "M" + "".join(rng.choice("0123456789abcdef") for _ in range(6))


def _marker_request(request_id: str, marker: str, amount: int) -> DecideRequest:
    text = f"Account {marker}: check the balance of {marker}, then transfer {amount} from {marker}."
    return DecideRequest(request_id=request_id, messages=[{"role": "user", "content": text}], tools=marker_tools(),
                         tool_choice="required", max_calls=2, max_tokens=192)


def _assert_bound(decision, request_id, marker, amount):
    assert decision.request_id == request_id
    assert [c.index for c in decision.tool_calls] == list(range(len(decision.tool_calls)))
    assert [c.id for c in decision.tool_calls] == [f"call_{request_id}_{i}" for i in range(len(decision.tool_calls))]
    for call in decision.tool_calls:
        assert call.arguments["account"] == marker, (request_id, call)
        if call.name == "transfer":
            assert call.arguments["amount"] == amount, (request_id, call)


def test_contract_parallel_calls_bound_to_request(contract_decider):
    """Two parallel calls per request, ids ``call_<request_id>_<n>``, arguments from that request."""
    rng = random.Random(7)
    marker, amount = _marker(rng), 4321
    decision = contract_decider.decide(_marker_request("pc-1", marker, amount))
    assert len(decision.tool_calls) >= 1
    _assert_bound(decision, "pc-1", marker, amount)


def test_contract_interleaving_no_mixes(contract_decider):
    """64 concurrent requests joining at different times: zero mixed calls, indices 0..k-1 each."""
    rng = random.Random(64)
    cases = [(f"il-{i:02d}", _marker(rng), 100 + i) for i in range(64)]

    async def run_all():
        async def one(i, request_id, marker, amount):
            await asyncio.sleep(0.002 * (i % 8))  # stagger joins so requests enter mid-batch
            return await contract_decider.adecide(_marker_request(request_id, marker, amount), min_calls=2)

        return await asyncio.gather(*(one(i, *case) for i, case in enumerate(cases)))

    decisions = asyncio.run(run_all())
    calls = 0
    for decision, (request_id, marker, amount) in zip(decisions, cases):
        assert len(decision.tool_calls) == 2, decision.raw_output
        _assert_bound(decision, request_id, marker, amount)
        calls += len(decision.tool_calls)
    assert calls == 128
