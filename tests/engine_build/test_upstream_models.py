"""The generated engine repository run through the real release code (vendored, CPU, stubbed Triton).

Upstream's preprocessing, postprocessing and BLS models of tensorrtllm_backend v0.19.0 run
``initialize()`` on the configs ``write_triton_repo`` wrote, and the BLS runs ``execute()``
end to end: preprocessing tokenizes, a stand-in for the C++ ``tensorrt_llm`` backend streams
the tokens of a known answer, postprocessing detokenizes. What the BLS sends back is what
Triton's gRPC handler would forward (see decider/triton_wire.py for the server's rules).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from python_backend_host import (
    COMPLETE_FINAL,
    RELEASES,
    InferenceRequest,
    InferenceResponse,
    ModelHost,
    Tensor,
    load_model,
    model_args,
)

from engine_build.config_check import load_repository
from engine_build.errors import ConfigCheckError
from engine_build.triton_repo import RepoOptions, write_triton_repo

ANSWER = '{"city": "北京", "sky": "晴"}'  # "晴" is not in the tiny vocabulary: three byte tokens
MAX_BATCH = 16


@pytest.fixture
def release_repo(tmp_path, tiny_model_dir, tiny_tokenizer):
    engine_dir = tmp_path / "engine"
    engine_dir.mkdir()
    result = write_triton_repo(
        RepoOptions(flavor="engine", output=tmp_path / "repo", model=str(tiny_model_dir), engine_dir=str(engine_dir),
                    max_batch_size=MAX_BATCH, model_code_from=RELEASES["v0.19.0"]),
        tiny_tokenizer,
    )
    return result.root


def _initialized(repo: Path, name: str, *, edit=None):
    model = load_model(repo / name)
    args = model_args(repo / name / "config.pbtxt")
    if edit is not None:
        config = json.loads(args["model_config"])
        edit(config)
        args["model_config"] = json.dumps(config)
    model.initialize(args)
    return model


def _text(response: InferenceResponse) -> str:
    (tensor,) = [t for t in response.output_tensors() if t.name() == "text_output"]
    return b"".join(tensor.as_numpy().reshape(-1)).decode("utf-8", errors="replace")


class FakeTensorrtLLM:
    """Stands in for the C++ ``tensorrtllm`` backend: streams one token per response.

    Shapes as ``inflight_batcher_llm/src/model_instance_state.cc`` (v0.19.0) writes them in
    streaming mode: ``output_ids`` [1, beams, new tokens], ``sequence_length`` [1, beams],
    ``output_log_probs`` [1, beams, new tokens] (lines 1176-1196).
    """

    def __init__(self, tokenizer, answer: str, *, fail: str | None = None) -> None:
        self.tokens = tokenizer.encode(answer, add_special_tokens=False)
        self.fail = fail
        self.requests: list[dict[str, np.ndarray]] = []

    def __call__(self, request: InferenceRequest):
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        self.requests.append(inputs)
        if inputs.get("stop", np.array([[False]])).reshape(-1)[0]:
            yield InferenceResponse([])
            return
        if self.fail:
            yield InferenceResponse(error=__import__("triton_python_backend_utils").TritonError(self.fail))
            return
        limit = int(inputs["request_output_len"].reshape(-1)[0])
        for token in self.tokens[:limit]:
            yield InferenceResponse([
                Tensor("output_ids", np.array([[[token]]], dtype=np.int32)),
                Tensor("sequence_length", np.array([[1]], dtype=np.int32)),
                Tensor("output_log_probs", np.array([[[-0.5]]], dtype=np.float32)),
            ])


def _host(repo: Path, backend) -> ModelHost:
    host = ModelHost()
    host.install()
    host.python_models["preprocessing"] = _initialized(repo, "preprocessing")
    host.python_models["postprocessing"] = _initialized(repo, "postprocessing")
    host.backends["tensorrt_llm"] = backend
    return host


def _bls_request(seed_name: str = "random_seed", max_tokens: int = 64) -> InferenceRequest:
    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"}}})
    return InferenceRequest(request_id="r-1", model_name="tensorrt_llm_bls", requested_output_names=["text_output"], inputs=[
        Tensor("text_input", np.array([[b"<|im_start|>user\nweather?<|im_end|>"]], dtype=object)),
        Tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
        Tensor("stream", np.array([[True]])),
        Tensor("exclude_input_in_output", np.array([[True]])),
        Tensor("temperature", np.array([[0.0]], dtype=np.float32)),
        Tensor("top_p", np.array([[1.0]], dtype=np.float32)),
        Tensor(seed_name, np.array([[7]], dtype=np.uint64)),
        Tensor("return_log_probs", np.array([[True]])),
        Tensor("guided_decoding_guide_type", np.array([[b"json_schema"]], dtype=object)),
        Tensor("guided_decoding_guide", np.array([[schema.encode()]], dtype=object)),
    ])


def test_release_preprocessing_needs_its_multimodal_parameter(release_repo):
    """Without ``multimodal_model_path`` the release's preprocessing fails to load (issue 14, item 1)."""
    with pytest.raises(KeyError, match="multimodal_model_path"):
        _initialized(release_repo, "preprocessing", edit=lambda c: c["parameters"].pop("multimodal_model_path"))
    params = load_repository(release_repo)["preprocessing"].parameters
    assert params["multimodal_model_path"].string_value == ""  # the release reads "" as "no vision engine"


@pytest.mark.parametrize("name", ["preprocessing", "postprocessing", "tensorrt_llm_bls"])
def test_release_models_initialize_on_the_generated_configs(release_repo, name):
    model = _initialized(release_repo, name)
    if name == "tensorrt_llm_bls":
        assert model.decoupled and model.accumulate_tokens and model.llm_model_name == "tensorrt_llm"
    if name == "preprocessing":
        assert model.add_special_tokens is False and model.is_multimodal is False


def test_generated_configs_keep_every_release_flag_and_scale_the_bls(release_repo):
    configs = load_repository(release_repo)
    ragged = [t.name for t in configs["tensorrt_llm"].input if t.allow_ragged_batch]
    assert len(ragged) >= 20  # the release's own inputs, flags included
    (group,) = configs["tensorrt_llm_bls"].instance_group
    assert group.count == MAX_BATCH  # one synchronous execute() per request in flight
    bls_inputs = {t.name for t in configs["tensorrt_llm_bls"].input}
    assert {"random_seed", "min_length"} <= bls_inputs and "seed" not in bls_inputs  # v0.19.0's names
    for config in configs.values():
        for key, value in config.parameters.items():
            assert "${" not in value.string_value, (config.name, key)


def test_release_bls_streams_whole_characters_then_an_empty_final(release_repo, tiny_tokenizer):
    llm = FakeTensorrtLLM(tiny_tokenizer, ANSWER)
    host = _host(release_repo, llm)
    bls = _initialized(release_repo, "tensorrt_llm_bls")
    request = _bls_request()
    assert bls.execute([request]) is None
    sent = request.sender.sent
    data, (last, last_flags) = sent[:-1], sent[-1]
    assert last is None and last_flags == COMPLETE_FINAL  # the final response is empty: flags only
    assert all(flags == 0 and response is not None for response, flags in data)
    assert len(data) == len(llm.tokens)
    texts = [_text(response) for response, _ in data]
    assert texts[-1] == ANSWER  # accumulate_tokens: each response is the whole text so far
    assert any(text.endswith("\ufffd") for text in texts)  # mid-character steps decode to a trailing U+FFFD
    assert all(ANSWER.startswith(text.rstrip("\ufffd")) for text in texts)
    # The decider's client turns exactly these texts into deltas, holding back the partial character.
    from decider.triton import _TextStream

    stream = _TextStream(cumulative=True)
    deltas = [stream.feed(text, final=False) for text in texts] + [stream.feed("", final=True)]
    assert "".join(deltas) == ANSWER and not any("\ufffd" in d for d in deltas)
    log_probs = [t for r, _ in data for t in r.output_tensors() if t.name() == "output_log_probs"]
    assert sum(t.as_numpy().shape[-1] for t in log_probs) == len(llm.tokens)  # what the client counts
    (sent_to_llm,) = llm.requests
    assert sent_to_llm["guided_decoding_guide_type"].reshape(-1)[0] == b"json_schema"
    assert int(sent_to_llm["random_seed"].reshape(-1)[0]) == 7
    assert int(sent_to_llm["end_id"].reshape(-1)[0]) == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert host.calls[0].model_name == "preprocessing"


def test_release_bls_without_accumulation_corrupts_split_characters(release_repo, tiny_tokenizer):
    """Why the generator sets accumulate_tokens: token-by-token decoding of "晴" yields U+FFFD."""
    llm = FakeTensorrtLLM(tiny_tokenizer, ANSWER)
    _host(release_repo, llm)
    bls = _initialized(release_repo, "tensorrt_llm_bls",
                       edit=lambda c: c["parameters"]["accumulate_tokens"].update(string_value="false"))
    request = _bls_request()
    bls.execute([request])
    joined = "".join(_text(r) for r, flags in request.sender.sent if r is not None)
    assert "晴" not in joined and "\ufffd" in joined


def test_release_bls_error_is_a_response_then_an_empty_final(release_repo, tiny_tokenizer):
    llm = FakeTensorrtLLM(tiny_tokenizer, ANSWER, fail="[TensorRT-LLM][ERROR] Assertion failed: prompt exceeds max input len")
    _host(release_repo, llm)
    bls = _initialized(release_repo, "tensorrt_llm_bls")
    request = _bls_request()
    bls.execute([request])
    (error, error_flags), (final, final_flags) = request.sender.sent
    assert error is not None and error.has_error() and error_flags == 0
    assert "Traceback" in error.error().message()  # the whole traceback travels as the message
    from decider.triton_wire import blames_request, error_summary

    assert "exceeds max input len" in error_summary(error.error().message())
    assert blames_request(error.error().message())
    assert final is None and final_flags == COMPLETE_FINAL


def test_release_bls_drops_inputs_of_a_later_release(release_repo, tiny_tokenizer):
    """v0.19.0's BLS reads only its own names: a ``seed`` would be dropped, so the client must resolve names."""
    llm = FakeTensorrtLLM(tiny_tokenizer, ANSWER)
    _host(release_repo, llm)
    bls = _initialized(release_repo, "tensorrt_llm_bls")
    request = _bls_request(seed_name="seed")

    def llm_inputs(_request):
        return llm.requests[0]

    bls.execute([request])
    first, _ = request.sender.sent[0]
    # triton_decoder.py input_names (v0.19.0) has no "seed": it never reaches tensorrt_llm. (Triton itself
    # rejects an undeclared input before the model runs; the protocol double does the same.)
    assert first is not None and not first.has_error()
    assert "seed" not in llm_inputs(request) and "random_seed" not in llm_inputs(request)


def test_release_without_guided_decoding_is_refused(tmp_path, tiny_model_dir, tiny_tokenizer):
    with pytest.raises(ConfigCheckError) as info:
        write_triton_repo(
            RepoOptions(flavor="engine", output=tmp_path / "repo", model=str(tiny_model_dir), engine_dir="/e",
                        model_code_from=RELEASES["v0.18.2"]),
            tiny_tokenizer,
        )
    assert any("tensorrtllm_backend v0.19.0" in p for p in info.value.problems)
