"""Engine mechanics on a tiny random-init Llama with the real SmolLM2 tokenizer (fast)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch

from decider.backend import GenerationRequest, InferenceBackend
from decider.embedded import EmbeddedEngine
from decider.engine_sequence import IncrementalDetokenizer
from decider.errors import InvalidRequestError, PromptTooLongError
from decider.model import tiny_random_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_random_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def engine(tiny_dir):
    torch.set_num_threads(1)
    with EmbeddedEngine.load(tiny_dir, device="cpu", dtype="float32", max_batch_size=16, max_seq_len=512) as eng:
        yield eng


def prompt_for(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)


def req(engine, rid: str, text: str, **kwargs) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt=prompt_for(engine, text), **kwargs)


def test_engine_implements_the_backend_protocol(engine):
    assert isinstance(engine, InferenceBackend)
    assert engine.name == "embedded"
    assert engine.tokenizer_info.vocab_size == engine.model.config.vocab_size
    assert engine.compile_json_schema('{"type": "integer"}') is engine.compile_json_schema('{"type": "integer"}')


def test_max_tokens_stops_with_length_and_counts_usage(engine):
    text, reason, usage = engine.generate_sync(req(engine, "len", "hello", max_tokens=7))
    assert reason == "length"
    assert usage["completion_tokens"] == 7
    assert usage["prompt_tokens"] == len(engine.encode(prompt_for(engine, "hello")))
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7


def test_greedy_is_deterministic_and_seeded_sampling_repeats(engine):
    first = engine.generate_sync(req(engine, "g1", "repeat me", max_tokens=12))
    second = engine.generate_sync(req(engine, "g2", "repeat me", max_tokens=12))
    assert first == second
    sampled = [engine.generate_sync(req(engine, f"s{i}", "sample", max_tokens=12, temperature=1.0, seed=7))[0]
               for i in range(2)]
    other = engine.generate_sync(req(engine, "s-other", "sample", max_tokens=12, temperature=1.0, seed=8))[0]
    assert sampled[0] == sampled[1]
    assert other != sampled[0]


def test_prompt_longer_than_context_is_refused(engine):
    long_prompt = "word " * 1000
    with pytest.raises(PromptTooLongError) as info:
        engine.generate_sync(GenerationRequest(request_id="long", prompt=long_prompt))
    assert info.value.context_length == 512
    assert info.value.prompt_tokens >= 512
    assert engine.active_requests == 0


def test_invalid_requests_are_refused_before_decoding(engine):
    with pytest.raises(InvalidRequestError):
        engine.generate_sync(req(engine, "bad-max", "x", max_tokens=0))
    with pytest.raises(InvalidRequestError):
        engine.generate_sync(req(engine, "bad-schema", "x", json_schema="{not json"))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"city": {"enum": ["Beijing", "上海", "Paris"]},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
         "required": ["city", "days"], "additionalProperties": False},
        {"type": "array", "minItems": 1, "maxItems": 3,
         "items": {"type": "string", "maxLength": 6}},
        {"anyOf": [{"type": "boolean"}, {"type": "object", "properties": {"ok": {"const": "yes"}},
                                         "required": ["ok"]}]},
        {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
         "required": ["code"]},
    ],
)
def test_constrained_output_validates(engine, schema):
    text, reason, _ = engine.generate_sync(req(engine, "schema", "give json", json_schema=json.dumps(schema),
                                               max_tokens=200))
    assert reason == "stop", text
    jsonschema.validate(json.loads(text), schema)


def test_precompiled_grammar_matches_schema_path(engine):
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
                         "required": ["n"]})
    compiled = engine.compiler.compile_json_schema(schema, any_whitespace=False)
    via_schema = engine.generate_sync(req(engine, "cg1", "n?", json_schema=schema, max_tokens=40))
    via_compiled = engine.generate_sync(req(engine, "cg2", "n?", json_schema=schema, compiled_grammar=compiled,
                                            max_tokens=40))
    assert via_schema == via_compiled


def test_stop_string_truncates_output(engine):
    full, _, _ = engine.generate_sync(req(engine, "nostop", "tell me a story", max_tokens=30))
    stop = full[10:13]
    assert len(stop) == 3
    text, reason, _ = engine.generate_sync(req(engine, "stop", "tell me a story", max_tokens=30, stop=(stop,)))
    assert reason == "stop"
    assert text == full[: full.index(stop)]


def test_incremental_detokenizer_never_splits_a_character(engine):
    sentence = "北京明天天气怎么样？转账给张三 100 元。🌟 héllo"
    ids = engine.encode(sentence)
    detok = IncrementalDetokenizer(engine._decode_ids, [])
    pieces = [detok.push([token]) for token in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == sentence
    assert all("\ufffd" not in piece for piece in pieces)
    assert len(ids) > len([p for p in pieces if p])  # some tokens were held back mid-character


async def test_streaming_chunks_reassemble_and_finish_once(engine):
    chunks = [chunk async for chunk in engine.generate(req(engine, "stream", "stream please", max_tokens=20))]
    assert chunks[-1].finished and chunks[-1].finish_reason == "length"
    assert all(not chunk.finished for chunk in chunks[:-1])
    assert all(chunk.request_id == "stream" for chunk in chunks)
    assert sum(len(chunk.token_ids) for chunk in chunks) == chunks[-1].usage["completion_tokens"] == 20
    text, _, _ = engine.generate_sync(req(engine, "stream-sync", "stream please", max_tokens=20))
    assert "".join(chunk.text for chunk in chunks) == text


async def test_cancellation_frees_slot_and_matcher(engine):
    schema = json.dumps({"type": "array", "items": {"type": "integer"}})  # unbounded: runs until cancelled
    request = req(engine, "cancel-me", "numbers", json_schema=schema, max_tokens=400)
    seen = 0
    stream = engine.generate(request)
    async for _ in stream:
        seen += 1
        if seen == 3:
            break
    await stream.aclose()
    for _ in range(200):
        if engine.active_requests == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.active_requests == 0
    assert sorted(engine.scheduler.free_slots) == list(range(engine.max_batch_size))
    # The slot is reusable straight away and the same id may be submitted again.
    text, reason, _ = engine.generate_sync(req(engine, "cancel-me", "numbers", max_tokens=5))
    assert reason == "length"


async def test_cancelling_the_consumer_task_cancels_the_request(engine):
    async def consume():
        async for _ in engine.generate(req(engine, "task-cancel", "go", max_tokens=400)):
            await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if engine.active_requests == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.active_requests == 0


def test_duplicate_in_flight_request_id_is_refused(engine):
    stream = engine.stream_sync(req(engine, "dup", "x", max_tokens=300))
    next(stream)
    with pytest.raises(InvalidRequestError):
        engine.generate_sync(req(engine, "dup", "x", max_tokens=3))
    # Another attempt of the same request id is a different request.
    assert engine.generate_sync(req(engine, "dup", "x", max_tokens=3, attempt=1))[1] == "length"
    stream.close()


def test_prefix_cache_reuses_shared_prompt_without_changing_output(engine, tiny_dir):
    system = "You are a tool-calling assistant. Tools: query_balance(account), transfer(to, amount). " * 4
    messages = lambda user: [{"role": "system", "content": system}, {"role": "user", "content": user}]  # noqa: E731
    prompts = [engine.tokenizer.apply_chat_template(messages(u), tokenize=False, add_generation_prompt=True)
               for u in ("balance please", "send 5 to bob")]
    outputs = [engine.generate_sync(GenerationRequest(request_id=f"pc{i}", prompt=p, max_tokens=10))
               for i, p in enumerate(prompts)]
    assert outputs[1][2]["cached_tokens"] >= 64
    with EmbeddedEngine.load(tiny_dir, device="cpu", dtype="float32", max_batch_size=2, max_seq_len=512,
                             prefix_cache_bytes=0) as uncached:
        fresh = uncached.generate_sync(GenerationRequest(request_id="fresh", prompt=prompts[1], max_tokens=10))
    assert fresh[2]["cached_tokens"] == 0
    assert fresh[0] == outputs[1][0]


async def test_batched_output_equals_output_alone(engine):
    """Per-request isolation: joining a busy batch at any step must not change a greedy result."""
    texts = [f"request number {i}: {'abc ' * (i % 5)}" for i in range(12)]
    alone = [engine.generate_sync(req(engine, f"alone-{i}", t, max_tokens=8 + 2 * i)) for i, t in enumerate(texts)]

    async def run(i, t):
        await asyncio.sleep(0.01 * (i % 4))
        parts, last = [], None
        async for chunk in engine.generate(req(engine, f"batched-{i}", t, max_tokens=8 + 2 * i)):
            parts.append(chunk.text)
            last = chunk
        return "".join(parts), last.finish_reason, last.usage

    batched = await asyncio.gather(*(run(i, t) for i, t in enumerate(texts)))
    assert engine.stats["max_batch_seen"] > 1
    for (a_text, a_reason, _), (b_text, b_reason, _) in zip(alone, batched):
        assert (a_text, a_reason) == (b_text, b_reason)


def test_jump_forward_feeds_forced_tokens_in_one_pass(tiny_dir):
    schema = {"type": "array", "minItems": 2, "maxItems": 2,
              "items": {"type": "object", "properties": {"marker": {"const": "a-long-forced-marker-0001"},
                                                         "n": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["marker", "n"], "additionalProperties": False}}
    with EmbeddedEngine.load(tiny_dir, device="cpu", dtype="float32", max_batch_size=2, max_seq_len=512,
                             jump_forward=True) as eng:
        text, reason, usage = eng.generate_sync(req(eng, "jf", "go", json_schema=json.dumps(schema), max_tokens=200))
        assert reason == "stop"
        jsonschema.validate(json.loads(text), schema)
        assert eng.stats["forced_tokens"] > usage["completion_tokens"] / 2
        assert eng.stats["decode_steps"] + eng.stats["extend_steps"] < usage["completion_tokens"] / 2


def test_generation_is_clipped_to_the_context(engine):
    prompt = prompt_for(engine, "fill " * 200)
    prompt_tokens = len(engine.encode(prompt))
    assert prompt_tokens < 512
    text, reason, usage = engine.generate_sync(GenerationRequest(request_id="clip", prompt=prompt, max_tokens=1000))
    assert reason == "length"
    assert usage["completion_tokens"] == 512 - prompt_tokens


def test_prefix_cache_evicts_least_recently_used_blocks():
    from decider.kv_runner import PrefixCache

    block = torch.zeros(2, 1, 4, 8)  # [layers, kv_heads, block, head_dim]: 256 bytes per k or v
    cache = PrefixCache(block=4, capacity_bytes=3 * 2 * block.numel() * block.element_size())
    first, second = list(range(12)), list(range(100, 112))
    cache.insert(first, 12, lambda s, e: (block.clone(), block.clone()))
    assert len(cache.match(first, 12)) == 3
    cache.insert(second, 8, lambda s, e: (block.clone(), block.clone()))
    assert len(cache.match(second, 12)) == 2
    assert len(cache.match(first, 12)) == 0  # its first block went first, so the chain is broken
    assert cache.size_bytes <= cache.capacity_bytes


def test_json_output_never_carries_raw_control_characters(engine):
    """xgrammar's token mask admits single-byte tokens like 0x10 inside strings; the engine masks them."""
    schema = json.dumps({"type": "object", "properties": {"memo": {"type": "string", "maxLength": 12}},
                         "required": ["memo"]})
    vocab = engine.tokenizer_info.decoded_vocab
    allowed = lambda row, token: (int(row[token >> 5]) >> (token & 31)) & 1  # noqa: E731
    assert not allowed(engine.sampler.json_safe_tokens, vocab.index(b"\x10"))
    assert allowed(engine.sampler.json_safe_tokens, vocab.index(b"\t"))
    assert not allowed(engine.sampler.json_strict_tokens, vocab.index(b"\t"))
    assert allowed(engine.sampler.json_strict_tokens, vocab.index(b"{"))

    def one(i):
        return engine.generate_sync(req(engine, f"memo-{i}", f"memo {i} {i * 7919 % 104729}", json_schema=schema,
                                        max_tokens=60))[0]

    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(one, range(40)))
    for text in texts:
        json.loads(text)  # strict: raises on raw control characters


def test_a_penalty_touches_only_tokens_the_model_chose_that_the_prompt_does_not_hold(engine):
    from decider.engine_sampling import allowed_count

    seq = engine._prepare(req(engine, "pen-1", "hello there", repetition_penalty=2.0), lambda item: None)
    copied = seq.prompt_ids[-1]
    chosen = next(t for t in range(100, engine.vocab_size) if t not in seq.prompt_tokens)
    for token in (copied, chosen):
        engine.scheduler.accept(seq, token)
    assert seq.penalizable == [chosen]  # a token copied from the prompt is never penalised
    def logits():
        out = torch.zeros(1, engine.vocab_size)
        out[0, chosen], out[0, copied] = 5.0, 4.0
        return out

    assert engine.sampler.pick([seq], logits(), [False]) == [copied]  # 5.0 / 2 < 4.0: only the chosen token paid
    plain = engine._prepare(req(engine, "pen-2", "hello there"), lambda item: None)
    engine.scheduler.accept(plain, chosen)
    assert plain.penalizable == [] and engine.sampler.pick([plain], logits(), [False]) == [chosen]
    row = torch.zeros(4, dtype=torch.int32)
    row[1] = 1 << 3
    assert allowed_count(row) == 1
