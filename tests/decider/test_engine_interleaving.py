"""The interleaving test: many constrained requests joining and leaving one running batch.

Each request's grammar forces a marker unique to it into both of its two calls. If any
per-request state (KV slot, matcher, bitmask row, output buffer, detokenizer) were addressed
by batch position, a request joining or finishing would shift rows and a marker would turn
up in another request's output, or a matcher would reject a token it did not produce.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest
import torch

from decider.backend import GenerationRequest
from decider.embedded import EmbeddedEngine
from decider.model import tiny_random_model

N_REQUESTS = 72
MARKER = re.compile(r'"marker": "([^"]*)("?)')


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    torch.set_num_threads(1)
    path = tiny_random_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    # Fewer slots than requests: some wait, and slots are reused as others finish. Plain decoding
    # (no jump-forward) keeps every request in the batch for one step per token: the most interleaving.
    with EmbeddedEngine.load(path, device="cpu", dtype="float32", max_batch_size=24, max_seq_len=512,
                             prefill_chunk=64, jump_forward=False) as eng:
        yield eng


def two_call_schema(marker: str, memo_len: int) -> dict:
    call = {
        "type": "object",
        "properties": {
            "name": {"enum": ["query_balance", "transfer"]},
            "marker": {"const": marker},
            "amount": {"type": "integer", "minimum": 0, "maximum": 9999},
            "memo": {"type": "string", "maxLength": memo_len},
        },
        "required": ["name", "marker", "amount", "memo"],
        "additionalProperties": False,
    }
    return {"type": "array", "minItems": 2, "maxItems": 2, "items": call}


async def test_interleaved_requests_never_mix(engine):
    rng = random.Random(1234)
    markers = [f"m{i:03d}x{rng.randrange(16**6):06x}" for i in range(N_REQUESTS)]
    plans = []
    for i, marker in enumerate(markers):
        truncated = i % 5 == 0  # these stop by length mid-JSON, at different steps
        plans.append({
            "marker": marker,
            "delay": rng.uniform(0, 1.5),
            "memo_len": rng.randrange(0, 12),
            "max_tokens": rng.randrange(12, 60) if truncated else 400,
            "user": f"account {rng.randrange(1000)}: check balance and transfer {rng.randrange(100)} " * (1 + i % 3),
        })

    async def run(plan):
        await asyncio.sleep(plan["delay"])
        prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": plan["user"]}], tokenize=False,
                                                      add_generation_prompt=True)
        request = GenerationRequest(request_id=plan["marker"], prompt=prompt, max_tokens=plan["max_tokens"],
                                    json_schema=json.dumps(two_call_schema(plan["marker"], plan["memo_len"])))
        parts, last = [], None
        async for chunk in engine.generate(request):
            assert chunk.request_id == plan["marker"]
            parts.append(chunk.text)
            last = chunk
        return "".join(parts), last

    results = await asyncio.gather(*(run(plan) for plan in plans))

    assert engine.stats["max_batch_seen"] >= 16, engine.stats
    finish_steps = {last.usage["completion_tokens"] for _, last in results}
    assert len(finish_steps) > 10  # requests really left the batch at different steps
    mixes = 0
    for plan, (text, last) in zip(plans, results):
        own = plan["marker"]
        others = [m for m in markers if m != own and m in text]
        mixes += len(others)
        if plan["max_tokens"] == 400:
            assert last.finish_reason == "stop", text
            calls = json.loads(text)  # strict
            assert [call["marker"] for call in calls] == [own, own]
        else:
            assert last.finish_reason == "length"
            assert last.usage["completion_tokens"] == plan["max_tokens"]
            for value, closed in MARKER.findall(text):
                assert value == own if closed else own.startswith(value), text
    assert mixes == 0
    assert engine.active_requests == 0
    assert sorted(engine.scheduler.free_slots) == list(range(engine.max_batch_size))
