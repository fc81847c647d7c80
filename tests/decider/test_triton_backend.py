"""The Triton backend against the wire-protocol double (tests/decider/triton_double.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import grpc
import pytest
from triton_double import TritonProtocolDouble, marker_generator, serve_double
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2_grpc

from decider.backend import GenerationRequest
from decider.errors import (
    DeciderPermanentError,
    DeciderRetryableError,
    GuidedDecodingNotConfiguredError,
    InvalidRequestError,
    StreamInterruptedError,
)
from decider.triton import TritonBackend
from engine_build.triton_repo import RepoOptions, write_triton_repo

RELEASE_V0190 = Path(__file__).resolve().parents[1] / "engine_build/vendor/tensorrtllm_backend-v0.19.0/all_models/inflight_batcher_llm"
SCHEMA = json.dumps({"type": "object", "properties": {"marker": {"type": "string"}}, "required": ["marker"]})


def _tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(['{"marker": "abc"}'] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


@pytest.fixture(scope="module", params=["engine", "pytorch"])
def repo(request, tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp(f"repo-{request.param}")
    result = write_triton_repo(
        RepoOptions(flavor=request.param, output=root, model="/models/m", engine_dir="/engines/m",
                    model_code_from=RELEASE_V0190), _tiny_tokenizer()
    )
    return root, result.entry_model


async def _with_double(repo, test, *, request_timeout_s: float = 20, **knobs):
    root, entry = repo
    double = TritonProtocolDouble(root, knobs.pop("produce", None) or marker_generator(), **knobs)
    server, url = await serve_double(double)
    backend = TritonBackend(url=url, model_name=entry, request_timeout_s=request_timeout_s)
    try:
        return await test(backend, double)
    finally:
        await backend.aclose()
        await server.stop(None)


async def _collect(backend, request):
    chunks = [chunk async for chunk in backend.generate(request)]
    assert chunks[-1].finished and all(not c.finished for c in chunks[:-1])
    assert all(c.request_id == request.request_id for c in chunks)
    return "".join(c.text for c in chunks), chunks


def test_64_requests_routed_by_id_under_out_of_order_responses(repo):
    async def run(backend, double):
        requests = [GenerationRequest(request_id=f"req-{i:02d}", prompt=f"say marker=m{i:02d}x", json_schema=SCHEMA,
                                      max_tokens=64) for i in range(64)]
        outputs = await asyncio.gather(*(_collect(backend, r) for r in requests))
        for request, (text, chunks) in zip(requests, outputs):
            value = json.loads(text)
            assert value == {"marker": request.prompt.split("marker=")[1], "guided": True}
            assert len(chunks) > 2  # really streamed
        assert double.stats.rejected == []
        assert sorted(double.stats.seen_ids) == [f"req-{i:02d}:0" for i in range(64)]
        # The double interleaved requests: the emission order is neither grouped by request nor in send order.
        order = [rid for rid, _ in double.stats.emitted]
        switches = sum(1 for a, b in zip(order, order[1:]) if a != b)
        assert switches > 64 * 2
        firsts = [rid for rid, index in double.stats.emitted if index == 0]
        assert firsts != sorted(firsts)
        assert backend.orphan_responses == 0

    asyncio.run(_with_double(repo, run, seed=3))


def test_server_without_guided_decoding_is_refused_at_startup(repo):
    async def run(backend, double):
        with pytest.raises(GuidedDecodingNotConfiguredError, match="guided_decoding_backend"):
            await backend.start()
        with pytest.raises(GuidedDecodingNotConfiguredError):
            await _collect(backend, GenerationRequest(request_id="r", prompt="x", json_schema=SCHEMA))
        assert double.stats.requests == 0  # nothing reached the server

    asyncio.run(_with_double(repo, run, drop_guided_decoding=True))


def test_duplicate_ids_cannot_be_in_flight(repo):
    async def run(backend, double):
        first = GenerationRequest(request_id="dup", prompt="marker=a1", json_schema=SCHEMA)
        agen = backend.generate(first)
        first_chunk = await agen.__anext__()
        with pytest.raises(InvalidRequestError, match="already in flight"):
            await _collect(backend, first)
        # A re-ask is a new attempt, hence a new wire id: allowed alongside.
        text, _ = await _collect(backend, GenerationRequest(request_id="dup", prompt="marker=b2", json_schema=SCHEMA, attempt=1))
        rest = first_chunk.text + "".join([c.text async for c in agen])
        assert json.loads(rest)["marker"] == "a1" and json.loads(text)["marker"] == "b2"
        assert double.stats.duplicate_ids == [] and sorted(double.stats.seen_ids) == ["dup:0", "dup:1"]

    asyncio.run(_with_double(repo, run))


def test_stream_cut_mid_response_is_a_typed_retryable_error(repo):
    async def run(backend, double):
        requests = [GenerationRequest(request_id=f"cut-{i}", prompt=f"marker=c{i}", json_schema=SCHEMA) for i in range(4)]
        finals: list = []

        async def consume(request):
            async for chunk in backend.generate(request):
                if chunk.finished:
                    finals.append(chunk)

        results = await asyncio.gather(*(consume(r) for r in requests), return_exceptions=True)
        assert all(isinstance(r, StreamInterruptedError) for r in results), results
        assert all(isinstance(r, DeciderRetryableError) for r in results)
        assert finals == []  # no partial output ever surfaced as final
        # The next request opens a new stream and succeeds.
        text, _ = await _collect(backend, GenerationRequest(request_id="after", prompt="marker=ok1", json_schema=SCHEMA))
        assert json.loads(text)["marker"] == "ok1"

    asyncio.run(_with_double(repo, run, cut_after=6))


def test_unconstrained_request_sends_no_guide(repo):
    async def run(backend, double):
        text, _ = await _collect(backend, GenerationRequest(request_id="free", prompt="marker=f1", stop=("\n",), seed=None))
        assert json.loads(text)["guided"] is False
        assert double.stats.rejected == []

    asyncio.run(_with_double(repo, run))


def test_double_rejects_tensors_that_do_not_match_exactly(repo):
    async def run(backend, double):
        await backend.start()
        message = backend._encode(GenerationRequest(request_id="bad", prompt="marker=x", json_schema=SCHEMA), "bad:0")
        message.inputs[1].datatype = "INT64"  # max_tokens
        message.inputs.add(name="min_tokens", datatype="INT32", shape=[1, 1])
        message.raw_input_contents.append(b"\0" * 4)
        channel = grpc.aio.insecure_channel(backend.url)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def one():
            yield message

        responses = [r async for r in stub.ModelStreamInfer(one())]
        await channel.close()
        assert len(responses) == 1 and responses[0].infer_response.id == "bad:0"
        assert "datatype INT64, expected INT32" in responses[0].error_message
        assert "unexpected input 'min_tokens'" in responses[0].error_message
        assert "triton_final_response" not in responses[0].infer_response.parameters  # failed before the model
        assert double.stats.rejected and double.stats.rejected[0][0] == "bad:0"

    asyncio.run(_with_double(repo, run))


def test_client_refuses_a_model_that_does_not_take_its_tensors(repo):
    async def run(backend, double):
        entry = double.configs[backend.model_name]
        for tensor in entry.input:
            if tensor.name == "max_tokens":
                tensor.data_type = mc.TYPE_INT64
        with pytest.raises(DeciderPermanentError, match="max_tokens"):
            await backend.start()

    asyncio.run(_with_double(repo, run))


def test_server_error_for_one_request_reaches_only_that_request(repo):
    async def produce(fields):
        if "boom" in fields["text_input"]:
            raise RuntimeError("engine fell over")
        async for piece in marker_generator()(fields):
            yield piece

    async def run(backend, double):
        good = GenerationRequest(request_id="good", prompt="marker=g1", json_schema=SCHEMA)
        bad = GenerationRequest(request_id="bad", prompt="boom", json_schema=SCHEMA)
        results = await asyncio.gather(_collect(backend, good), _collect(backend, bad), return_exceptions=True)
        assert json.loads(results[0][0])["marker"] == "g1"
        assert isinstance(results[1], DeciderRetryableError) and "engine fell over" in str(results[1])

    asyncio.run(_with_double(repo, run, produce=produce))


def test_client_that_forgets_the_empty_final_opt_in_hangs_on_the_bls(repo, monkeypatch):
    """Triton forwards the BLS's empty final only to requests that ask for it: without the opt-in, no end."""
    _root, entry = repo
    if entry != "tensorrt_llm_bls":
        pytest.skip("the LLM-API model flags its last data response final")
    encode = TritonBackend._encode

    def forgetful(self, request, triton_id):
        message = encode(self, request, triton_id)
        del message.parameters["triton_enable_empty_final_response"]
        return message

    async def run(backend, double):
        request = GenerationRequest(request_id="hang", prompt="marker=h1", json_schema=SCHEMA)
        with pytest.raises(DeciderRetryableError, match="no final response"):
            await _collect(backend, request)
        assert double.stats.swallowed_finals == ["hang:0"]

    monkeypatch.setattr(TritonBackend, "_encode", forgetful)
    asyncio.run(_with_double(repo, run, request_timeout_s=1.5))


def test_every_request_asks_for_the_empty_final(repo):
    async def run(backend, double):
        await backend.start()
        message = backend._encode(GenerationRequest(request_id="p", prompt="x", seed=3), "p:0")
        assert message.parameters["triton_enable_empty_final_response"].bool_param is True
        names = {tensor.name for tensor in message.inputs}
        # The served release's names: v0.19.0's BLS takes random_seed; toolrail's LLM-API model takes seed.
        assert ("random_seed" in names) == (backend.model_name == "tensorrt_llm_bls")
        assert ("seed" in names) == (backend.model_name == "llmapi")
        text, _chunks = await _collect(backend, GenerationRequest(request_id="s", prompt="marker=s1", seed=3))
        assert json.loads(text)["marker"] == "s1" and double.stats.rejected == []
        assert double.stats.swallowed_finals == []

    asyncio.run(_with_double(repo, run))


def test_finish_reason_says_length_when_max_tokens_cut_the_text(repo):
    async def run(backend, double):
        _text, chunks = await _collect(backend, GenerationRequest(request_id="cut", prompt="marker=l1", max_tokens=3))
        assert chunks[-1].finish_reason == "length"
        text, chunks = await _collect(backend, GenerationRequest(request_id="full", prompt="marker=l2", max_tokens=64))
        assert chunks[-1].finish_reason == "stop" and json.loads(text)["marker"] == "l2"

    asyncio.run(_with_double(repo, run))


def test_errors_are_classified_by_their_summary_line_not_by_words_in_a_traceback():
    from decider.triton_wire import blames_request

    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/models/tensorrt_llm_bls/1/lib/decode.py", line 110, in validate_invalid_unexpected\n'
        "pb_utils.TritonModelException: Executor worker died (CUDA error: an illegal memory access)"
    )
    assert not blames_request(traceback)
    assert blames_request("Traceback (most recent call last):\nlib.decode.RequestValidationError: max_tokens must be a single value > 0")
    assert blames_request("[request id: r:0] unexpected shape for input 'top_p' for model 'tensorrt_llm_bls'")


class _ServerThread:
    """Runs the double in its own event loop thread (the decider runs its own loop)."""

    def __init__(self, double: TritonProtocolDouble) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server, self.url = asyncio.run_coroutine_threadsafe(serve_double(double), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_request_id_is_unique_per_attempt():
    from decider.triton import triton_request_id

    assert triton_request_id(GenerationRequest(request_id="r1", prompt="", attempt=2)) == "r1:2"


__all__ = ["_ServerThread", "_tiny_tokenizer"]
