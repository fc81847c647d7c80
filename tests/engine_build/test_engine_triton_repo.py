from __future__ import annotations

import json
import re

import pytest
from google.protobuf import text_format
from python_backend_host import RELEASES
from tritonclient.grpc import model_config_pb2 as mc

from engine_build.config_check import (
    CLIENT_INPUTS,
    entry_problems,
    guided_decoding_problems,
    load_repository,
    parse_config,
    request_problems,
    require_servable,
)
from engine_build.errors import ConfigCheckError
from engine_build.triton_repo import RepoOptions, build_configs, write_triton_repo

V0190 = RELEASES["v0.19.0"]


@pytest.fixture
def engine_repo(tmp_path, tiny_tokenizer):
    opts = RepoOptions(flavor="engine", output=tmp_path / "engine_repo", model="/models/qwen", engine_dir="/engines/qwen-h100",
                       server_root="/srv/repo", model_code_from=V0190)
    return write_triton_repo(opts, tiny_tokenizer, stop_token_ids=[0, 2])


@pytest.fixture
def pytorch_repo(tmp_path, tiny_tokenizer):
    opts = RepoOptions(flavor="pytorch", output=tmp_path / "pytorch_repo", model="Qwen/Qwen2.5-7B-Instruct",
                       llm_api_options={"max_batch_size": 64, "guided_decoding_backend": "xgrammar"})
    return write_triton_repo(opts, tiny_tokenizer)


@pytest.mark.parametrize("flavor", ["engine", "pytorch"])
def test_every_config_parses_as_model_config_with_no_placeholders(flavor, engine_repo, pytorch_repo):
    repo = engine_repo if flavor == "engine" else pytorch_repo
    paths = sorted(repo.root.glob("*/config.pbtxt"))
    assert {p.parent.name for p in paths} == set(repo.models)
    for path in paths:
        text = path.read_text()
        assert not re.search(r"\$\{", text), path
        config = text_format.Parse(text, mc.ModelConfig())
        assert config.name == path.parent.name
        for key, value in config.parameters.items():
            assert "${" not in value.string_value, (path, key)
    configs = load_repository(repo.root)
    require_servable(configs, repo.entry_model)


def test_engine_repo_wiring(engine_repo):
    configs = load_repository(engine_repo.root)
    assert engine_repo.entry_model == "tensorrt_llm_bls"
    llm = configs["tensorrt_llm"]
    assert llm.backend == "tensorrtllm" and llm.model_transaction_policy.decoupled
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert params["guided_decoding_backend"] == "xgrammar"
    assert params["xgrammar_tokenizer_info_path"] == "/srv/repo/tensorrt_llm/xgrammar_tokenizer_info.json"
    assert params["gpt_model_path"] == "/engines/qwen-h100"
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["enable_kv_cache_reuse"] == "true"
    assert (engine_repo.root / "tensorrt_llm" / "xgrammar_tokenizer_info.json").is_file()
    assert configs["tensorrt_llm_bls"].model_transaction_policy.decoupled
    ensemble = configs["ensemble"]
    step = {s.model_name: s for s in ensemble.ensemble_scheduling.step}["tensorrt_llm"]
    assert step.input_map["guided_decoding_guide"] == "guided_decoding_guide"
    assert step.input_map["streaming"] == "stream"
    require_servable(configs, "ensemble")
    manifest = json.loads((engine_repo.root / "toolrail_repo_manifest.json").read_text())
    assert manifest["entry_model"] == "tensorrt_llm_bls" and "tensorrt_llm/config.pbtxt" in manifest["files"]
    assert "tensorrt_llm_bls/1/lib/decode.py" in manifest["files"]  # the release's model code, copied
    # The grammar may only end on the executor's end_id (preprocessing's tokenizer EOS).
    info = json.loads((engine_repo.root / "tensorrt_llm" / "xgrammar_tokenizer_info.json").read_text())
    assert info["stop_token_ids"] == [2] and any("narrowed" in note for note in engine_repo.notes)


def test_pytorch_repo_ships_model_code_and_options(pytorch_repo):
    root = pytorch_repo.root
    source = (root / "llmapi" / "1" / "model.py").read_text()
    compile(source, "model.py", "exec")
    assert "GuidedDecodingParams" in source
    import yaml

    options = yaml.safe_load((root / "llmapi" / "llm_api_options.yaml").read_text())
    assert options["guided_decoding_backend"] == "xgrammar" and options["backend"] == "pytorch"


def test_llmapi_model_adds_no_second_bos(pytorch_repo, monkeypatch):
    """The prompt arrives rendered (BOS included): SamplingParams(add_special_tokens=False), guide mapped."""
    import sys
    import types

    import numpy as np
    from python_backend_host import (
        InferenceRequest,
        Tensor,
        install_pb_utils,
        load_model,
    )

    install_pb_utils()
    trtllm = types.ModuleType("tensorrt_llm")
    trtllm.SamplingParams = lambda **kw: kw
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.GuidedDecodingParams = lambda **kw: ("guide", kw)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", trtllm)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    model = load_model(pytorch_repo.root / "llmapi")
    request = InferenceRequest(inputs=[
        Tensor("max_tokens", np.array([[8]], dtype=np.int32)),
        Tensor("seed", np.array([[5]], dtype=np.uint64)),
        Tensor("guided_decoding_guide_type", np.array([[b"json_schema"]], dtype=object)),
        Tensor("guided_decoding_guide", np.array([[b'{"type": "object"}']], dtype=object)),
    ])
    params = model._sampling_params(request)
    assert params["add_special_tokens"] is False and params["seed"] == 5 and params["max_tokens"] == 8
    assert params["guided_decoding"] == ("guide", {"json": '{"type": "object"}'})


def _mutate(configs, name, fn):
    copy = {k: mc.ModelConfig.FromString(v.SerializeToString()) for k, v in configs.items()}
    fn(copy[name])
    return copy


@pytest.mark.parametrize(
    ("model", "mutation", "problem"),
    [
        ("tensorrt_llm", lambda c: c.parameters.pop("guided_decoding_backend"), "guided_decoding_backend is None"),
        ("tensorrt_llm", lambda c: c.parameters["guided_decoding_backend"].__setattr__("string_value", "outlines"), "outlines"),
        ("tensorrt_llm", lambda c: c.parameters.pop("xgrammar_tokenizer_info_path"), "xgrammar_tokenizer_info_path is unset"),
        ("tensorrt_llm", lambda c: c.parameters["xgrammar_tokenizer_info_path"].__setattr__("string_value", "${x}"), "unset"),
        ("tensorrt_llm", lambda c: c.model_transaction_policy.__setattr__("decoupled", False), "decoupled mode is off"),
        ("tensorrt_llm_bls", lambda c: c.input.pop(), "guided_decoding_guide"),
        ("tensorrt_llm_bls", lambda c: c.model_transaction_policy.__setattr__("decoupled", False), "decoupled"),
    ],
)
def test_unguided_or_mismatched_repos_are_named(engine_repo, model, mutation, problem):
    configs = _mutate(load_repository(engine_repo.root), model, mutation)
    with pytest.raises(ConfigCheckError) as info:
        require_servable(configs, "tensorrt_llm_bls")
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_ensemble_that_drops_the_guide_is_detected(engine_repo):
    def drop(c):
        for step in c.ensemble_scheduling.step:
            step.input_map.pop("guided_decoding_guide", None)

    configs = _mutate(load_repository(engine_repo.root), "ensemble", drop)
    assert any("does not route 'guided_decoding_guide'" in p for p in guided_decoding_problems(configs, "ensemble"))


def test_entry_checks_names_dtypes_dims(engine_repo):
    bls = load_repository(engine_repo.root)["tensorrt_llm_bls"]
    assert entry_problems(bls) == []
    bad = mc.ModelConfig.FromString(bls.SerializeToString())
    for tensor in bad.input:
        if tensor.name == "max_tokens":
            tensor.data_type = mc.TYPE_INT64
        if tensor.name == "top_p":
            tensor.dims[:] = [2]
    bad.input.add(name="must_have", data_type=mc.TYPE_INT32, dims=[1])
    problems = entry_problems(bad)
    assert any("'max_tokens' is TYPE_INT64" in p for p in problems)
    assert any("'top_p' has dims [2]" in p for p in problems)
    assert any("'must_have' is required" in p for p in problems)


def test_request_tensors_checked_exactly(pytorch_repo):
    config = load_repository(pytorch_repo.root)["llmapi"]
    good = {spec.name: (spec.wire, [1, *[1 if d == -1 else d for d in spec.dims]]) for spec in CLIENT_INPUTS
            if not spec.if_declared}
    assert request_problems(config, good) == []
    assert request_problems(config, {**good, "max_tokens": ("INT64", [1, 1])}) == ["input 'max_tokens': datatype INT64, expected INT32"]
    assert "unexpected input 'random_seed'" in request_problems(config, {**good, "random_seed": ("UINT64", [1, 1])})
    assert any("shape [1]" in p for p in request_problems(config, {**good, "text_input": ("BYTES", [1])}))
    missing = dict(good)
    del missing["text_input"]
    assert request_problems(config, missing) == ["missing required input 'text_input'"]


def test_unfilled_template_text_is_refused():
    with pytest.raises(ConfigCheckError, match="unfilled"):
        parse_config('name: "x"\nmax_batch_size: ${triton_max_batch_size}\n')


def test_engine_flavor_is_generated_from_the_release_templates(tmp_path, tiny_tokenizer):
    with pytest.raises(ValueError, match="model_code_from"):
        build_configs(RepoOptions(flavor="engine", output=tmp_path / "x", model="/m", engine_dir="/e"))
    # A release template with a new parameter and a new optional input: both kept, the parameter filled empty.
    upstream = tmp_path / "inflight_batcher_llm"
    import shutil

    shutil.copytree(V0190, upstream)
    template = upstream / "tensorrt_llm_bls" / "config.pbtxt"
    template.write_text(template.read_text() + """
input [ { name: "new_in_this_release" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
parameters: { key: "new_knob" value: { string_value: "${new_knob}" } }
""")
    repo = write_triton_repo(
        RepoOptions(flavor="engine", output=tmp_path / "repo", model="/m", engine_dir="/e", model_code_from=upstream,
                    copy_model_code=False),
        tiny_tokenizer,
    )
    configs = load_repository(repo.root)
    assert "new_in_this_release" in {t.name for t in configs["tensorrt_llm_bls"].input}
    assert configs["tensorrt_llm_bls"].parameters["new_knob"].string_value == ""
    assert configs["tensorrt_llm_bls"].max_batch_size == 64
    assert not (repo.root / "tensorrt_llm_bls" / "1" / "model.py").exists()
    # A placeholder in a numeric position that toolrail does not know is refused loudly.
    template.write_text(template.read_text().replace("count: ${bls_instance_count}", "count: ${bls_new_count}"))
    with pytest.raises(ConfigCheckError, match="bls_new_count"):
        build_configs(RepoOptions(flavor="engine", output=tmp_path / "y", model="/m", engine_dir="/e", model_code_from=upstream))


def test_cli_triton_repo(tmp_path, tiny_model_dir, capsys):
    from toolrail.cli import main

    out = tmp_path / "repo"
    assert main(["engine", "triton-repo", "--output", str(out), "--flavor", "engine", "--model", str(tiny_model_dir),
                 "--engine-dir", "/e"]) == 2
    assert "--model-code-from" in capsys.readouterr().err
    assert main(["engine", "triton-repo", "--output", str(tmp_path / "engine"), "--flavor", "engine", "--model",
                 str(tiny_model_dir), "--engine-dir", "/e", "--model-code-from", str(V0190)]) == 0
    assert "TOOLRAIL_TRITON_MODEL=tensorrt_llm_bls" in capsys.readouterr().out
    assert main(["engine", "triton-repo", "--output", str(out), "--flavor", "pytorch", "--model", str(tiny_model_dir)]) == 0
    assert "TOOLRAIL_TRITON_MODEL=llmapi" in capsys.readouterr().out
    # The LLM API builds its grammar tokenizer info itself: the repository carries no file nothing reads.
    assert not list(out.rglob("xgrammar_tokenizer_info.json"))
    assert "tokenizer_info" not in (out / "llmapi" / "config.pbtxt").read_text()
