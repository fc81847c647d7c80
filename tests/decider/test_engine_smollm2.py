"""End to end on the real SmolLM2-135M-Instruct weights (``make test`` pulls them first)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch

from decider.backend import GenerationRequest
from decider.embedded import EmbeddedEngine

pytestmark = pytest.mark.model

WEATHER_CALLS = {
    "type": "array",
    "minItems": 1,
    "maxItems": 1,
    "items": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {"city": {"enum": ["北京", "上海", "Paris"]},
                               "date": {"enum": ["today", "tomorrow"]}},
                "required": ["city", "date"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def engine():
    # One thread: on a shared 2-core machine, spinning OpenMP workers oversubscribe badly.
    torch.set_num_threads(1)
    with EmbeddedEngine.load(max_batch_size=8, max_seq_len=1024) as eng:
        yield eng


def chat(engine, user: str, system: str | None = None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_real_model_answers_plain_question(engine):
    text, reason, usage = engine.generate_sync(
        GenerationRequest(request_id="paris", prompt=chat(engine, "What is the capital of France?"), max_tokens=12))
    assert "Paris" in text
    assert reason in {"stop", "length"}
    assert usage["completion_tokens"] <= 12


async def test_real_model_constrained_tool_calls_stream_and_validate(engine):
    system = "You call tools. Answer with a JSON list of tool calls."
    request = GenerationRequest(request_id="weather", prompt=chat(engine, "北京明天天气怎么样", system),
                                json_schema=json.dumps(WEATHER_CALLS), max_tokens=60)
    chunks = [chunk async for chunk in engine.generate(request)]
    text = "".join(chunk.text for chunk in chunks)
    assert chunks[-1].finish_reason == "stop"
    assert all("\ufffd" not in chunk.text for chunk in chunks)
    calls = json.loads(text)
    jsonschema.validate(calls, WEATHER_CALLS)
    assert calls[0]["name"] == "get_weather"


async def test_real_model_batched_equals_alone(engine):
    """Per-request isolation on the real weights (bf16): joining a batch never changes a greedy answer."""
    system = "You call tools. Answer with a JSON list of tool calls."
    users = ["北京明天天气怎么样", "What's the weather in Paris today?", "上海今天天气"]
    requests = [GenerationRequest(request_id=f"b{i}", prompt=chat(engine, user, system),
                                  json_schema=json.dumps(WEATHER_CALLS), max_tokens=60)
                for i, user in enumerate(users)]
    alone = [engine.generate_sync(r)[0] for r in requests]

    async def run(i, r):
        await asyncio.sleep(0.05 * i)
        return "".join([c.text async for c in engine.generate(GenerationRequest(
            request_id=f"batched-{i}", prompt=r.prompt, json_schema=r.json_schema, max_tokens=r.max_tokens))])

    batched = await asyncio.gather(*(run(i, r) for i, r in enumerate(requests)))
    assert batched == alone
    for text in batched:
        jsonschema.validate(json.loads(text), WEATHER_CALLS)
