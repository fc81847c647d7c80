"""The embedded engine's dtype modes: what ``auto`` picks, and that hybrid decoding decides alike."""

from __future__ import annotations

import json

import pytest
import torch

from decider.backend import GenerationRequest
from decider.embedded import EmbeddedEngine
from decider.engine_loading import DTYPE_MODES, resolve_dtype
from decider.model import tiny_random_model

CPU = torch.device("cpu")


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Pretend the CPU has (or lacks) native bf16 matmuls."""

    def set_native(avx512_bf16: bool, amx: bool = False) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)

    return set_native


@pytest.mark.parametrize("dtype", [None, "auto"])
def test_auto_keeps_bf16_where_the_cpu_has_it(cpu_bf16, dtype):
    cpu_bf16(True)
    assert resolve_dtype(dtype, CPU) == (torch.bfloat16, torch.bfloat16)
    cpu_bf16(False, amx=True)
    assert resolve_dtype(dtype, CPU) == (torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize("dtype", [None, "auto"])
def test_auto_is_hybrid_on_cpus_without_native_bf16(cpu_bf16, dtype):
    cpu_bf16(False)
    assert resolve_dtype(dtype, CPU) == (torch.float32, torch.bfloat16)


def test_auto_on_a_gpu_stays_bf16(cpu_bf16):
    cpu_bf16(False)
    assert resolve_dtype(None, torch.device("cuda")) == (torch.bfloat16, torch.bfloat16)


@pytest.mark.parametrize(("dtype", "expected"), [
    ("float32", (torch.float32, torch.float32)),
    ("bfloat16", (torch.bfloat16, torch.bfloat16)),
    ("bf16", (torch.bfloat16, torch.bfloat16)),
    ("float16", (torch.float16, torch.float16)),
    ("hybrid", (torch.float32, torch.bfloat16)),
    (torch.float32, (torch.float32, torch.float32)),
    (torch.bfloat16, (torch.bfloat16, torch.bfloat16)),
])
def test_explicit_dtypes_are_honoured_whatever_the_cpu(cpu_bf16, dtype, expected):
    for native in (False, True):
        cpu_bf16(native)
        assert resolve_dtype(dtype, CPU) == expected


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="int4"):
        resolve_dtype("int4", CPU)
    assert "hybrid" in DTYPE_MODES


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_random_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def test_hybrid_engine_keeps_fp32_weights_and_cache_and_decodes_with_a_bf16_copy(tiny_dir):
    torch.set_num_threads(1)
    with EmbeddedEngine.load(tiny_dir, device="cpu", dtype="hybrid", max_batch_size=2, max_seq_len=256) as engine:
        runner = engine.scheduler.runner
        assert (engine.dtype, engine.decode_dtype) == (torch.float32, torch.bfloat16)
        assert runner.k.dtype == runner.v.dtype == torch.float32
        assert runner.full.lm_head.weight.dtype == torch.float32
        assert runner.step.lm_head.weight.dtype == torch.bfloat16
        # The copy keeps the embedding tied to the output head, like the original.
        assert (runner.step.lm_head.weight is runner.step.embed.weight) == (
            runner.full.lm_head.weight is runner.full.embed.weight)
        text, reason, usage = engine.generate_sync(GenerationRequest(request_id="h", prompt="Hello there", max_tokens=8))
        assert reason == "length" and usage["completion_tokens"] == 8
        assert engine.stats["decode_tokens"] == 7  # the first token comes from the fp32 prefill


WEATHER_CALLS = {
    "type": "array", "minItems": 1, "maxItems": 2,
    "items": {
        "type": "object",
        "properties": {
            "name": {"enum": ["get_weather", "query_balance"]},
            "arguments": {"type": "object",
                          "properties": {"city": {"enum": ["Paris", "北京", "Oslo", "Rome", "London"]}, "date": {"enum": ["today", "tomorrow"]}},
                          "required": ["city", "date"], "additionalProperties": False},
        },
        "required": ["name", "arguments"], "additionalProperties": False,
    },
}


@pytest.mark.slow  # the real model loaded twice, six unassisted decodes: ~25 s (make test-slow)
@pytest.mark.model
def test_hybrid_decodes_the_same_greedy_tokens_as_float32_on_a_constrained_decision():
    """bf16 decode weights round the logits; on these decisions the greedy choice never flips.

    This is the property the hybrid default rests on (the dev quality split agrees too); a
    near-tie between two tokens could flip in principle, so the prompts are real decisions,
    not adversarial ones.
    """
    torch.set_num_threads(1)
    system = "You call tools. Answer with a JSON list of tool calls."
    users = ["What's the weather in Paris tomorrow?", "北京今天天气怎么样", "Weather in Oslo and Rome today please"]
    outputs = {}
    for mode in ("float32", "hybrid"):
        # Jump-forward off: every generated token after the first goes through a decode step.
        with EmbeddedEngine.load(dtype=mode, max_batch_size=2, max_seq_len=1024, jump_forward=False) as engine:
            prompts = [engine.tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": user}],
                tokenize=False, add_generation_prompt=True) for user in users]
            ids = []
            for index, prompt in enumerate(prompts):
                chunks = list(engine.stream_sync(GenerationRequest(
                    request_id=f"{mode}-{index}", prompt=prompt, json_schema=json.dumps(WEATHER_CALLS), max_tokens=60)))
                assert chunks[-1].finish_reason == "stop"
                ids.append([token for chunk in chunks for token in chunk.token_ids])
            assert engine.stats["decode_tokens"] > 20  # most tokens did go through the bf16 decode weights
            outputs[mode] = ids
    assert outputs["hybrid"] == outputs["float32"]
