from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine_build.errors import (
    PlanError,
    UnknownModelFamilyError,
    UnsupportedVersionError,
)
from engine_build.plan import BuildOptions, plan_build

SRC = Path("/opt/TensorRT-LLM")


def _opts(model_dir: Path, **kw) -> BuildOptions:
    base = dict(model=str(model_dir), gpu="h100", trtllm_version="0.20.0", trtllm_src=SRC, output_root=Path("/out"))
    base.update(kw)
    return BuildOptions(**base)


def _set_model_type(model_dir: Path, model_type: str) -> None:
    (model_dir / "config.json").write_text(f'{{"model_type": "{model_type}"}}')


# (model_type, gpu, version, quantization) → (backend, first step, script, gemm plugin)
ENGINE_TABLE = [
    ("llama", "h100", "0.20.0", "none", "convert", "examples/models/core/llama/convert_checkpoint.py", "bfloat16"),
    ("llama", "a100", "0.19.0", "none", "convert", "examples/models/core/llama/convert_checkpoint.py", "bfloat16"),
    ("qwen2", "h100", "0.19.0", "none", "convert", "examples/models/core/qwen/convert_checkpoint.py", "bfloat16"),
    ("qwen2", "l40s", "0.21.0", "none", "convert", "examples/models/core/qwen/convert_checkpoint.py", "bfloat16"),
    ("mistral", "a10g", "0.20.0", "none", "convert", "examples/models/core/llama/convert_checkpoint.py", "bfloat16"),
    ("falcon", "h100", "0.20.0", "none", "convert", "examples/models/contrib/falcon/convert_checkpoint.py", "bfloat16"),
    ("qwen2", "h100", "0.20.0", "fp8", "quantize", "examples/quantization/quantize.py", "auto"),
    ("llama", "l40s", "0.19.0", "fp8", "quantize", "examples/quantization/quantize.py", "auto"),
]


@pytest.mark.parametrize(("model_type", "gpu", "version", "quant", "first", "script", "gemm"), ENGINE_TABLE)
def test_engine_plans_per_family_gpu_version(tiny_model_dir, tmp_path, model_type, gpu, version, quant, first, script, gemm):
    _set_model_type(tiny_model_dir, model_type)
    calib = tmp_path / "calib"
    calib.mkdir()
    plan = plan_build(_opts(tiny_model_dir, gpu=gpu, trtllm_version=version, quantization=quant, calib_dataset=calib))
    assert plan.backend == "engine"
    assert [s.name for s in plan.steps] == [first, "trtllm-build", "tokenizer-info"]
    convert = plan.steps[0].argv
    assert convert[1] == str(SRC / script)
    assert convert[convert.index("--model_dir") + 1] == str(tiny_model_dir)
    assert convert[convert.index("--output_dir") + 1] == str(plan.checkpoint_dir)
    if quant == "fp8":
        assert convert[convert.index("--calib_dataset") + 1] == str(calib)  # local: never the hub default
        assert convert[convert.index("--qformat") + 1] == "fp8"
        assert convert[convert.index("--kv_cache_dtype") + 1] == "fp8"
    build = list(plan.steps[1].argv)
    assert build[0] == "trtllm-build"
    flags = dict(zip(build[1::2], build[2::2]))
    assert flags["--checkpoint_dir"] == str(plan.checkpoint_dir)
    assert flags["--output_dir"] == str(plan.engine_dir)
    assert flags["--gemm_plugin"] == gemm
    assert flags["--kv_cache_type"] == "paged"
    assert flags["--use_paged_context_fmha"] == "enable"
    assert flags["--max_batch_size"] == "64"
    assert flags["--max_input_len"] == "4096"
    assert flags["--max_seq_len"] == "5120"
    assert flags["--max_num_tokens"] == "8192"
    assert ("--use_fp8_context_fmha" in flags) == (quant == "fp8")
    assert f"sm{plan.gpu.sm}" in plan.out_dir.name and f"trtllm{version}" in plan.out_dir.name


def test_gemma_uses_its_own_converter_flags(tiny_model_dir):
    """examples/models/core/gemma/convert_checkpoint.py: --ckpt-type, --model-dir, --output-model-dir, --world-size."""
    _set_model_type(tiny_model_dir, "gemma2")
    plan = plan_build(_opts(tiny_model_dir, tp=2))
    argv = plan.steps[0].argv
    assert argv[1] == str(SRC / "examples/models/core/gemma/convert_checkpoint.py")
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags == {"--ckpt-type": "hf", "--model-dir": str(tiny_model_dir), "--output-model-dir": str(plan.checkpoint_dir),
                     "--dtype": "bfloat16", "--world-size": "2"}
    with pytest.raises(PlanError, match="tensor parallelism only"):
        plan_build(_opts(tiny_model_dir, pp=2))


def test_engine_plan_names_where_the_release_triton_models_live(tiny_model_dir):
    assert any("tensorrtllm_backend v0.19.0: all_models" in n for n in plan_build(_opts(tiny_model_dir, trtllm_version="0.19.0")).notes)
    assert any("TensorRT-LLM v0.20.0: triton_backend/all_models" in n for n in plan_build(_opts(tiny_model_dir)).notes)


@pytest.mark.parametrize("version", ["1.0.0", "1.0.1"])
def test_pytorch_backend_is_the_default_from_1_0(tiny_model_dir, version):
    plan = plan_build(_opts(tiny_model_dir, trtllm_version=version))
    assert plan.backend == "pytorch"
    assert [s.name for s in plan.steps] == ["llm-api-options"]  # the LLM API reads no tokenizer-info file
    assert plan.commands() == []
    assert plan.llm_api_options["guided_decoding_backend"] == "xgrammar"
    assert plan.llm_api_options["disable_overlap_scheduler"] is True
    assert plan.llm_api_options["kv_cache_config"]["enable_block_reuse"] is True
    assert plan.llm_api_options["max_batch_size"] == 64


def test_pytorch_backend_takes_a_hub_id():
    plan = plan_build(BuildOptions(model="Qwen/Qwen2.5-7B-Instruct", gpu="h100", trtllm_version="1.0.0"))
    assert plan.model_type == "qwen2" and plan.model_fingerprint == "hub:Qwen/Qwen2.5-7B-Instruct@main"


def test_engine_on_1_0_is_allowed_with_a_note(tiny_model_dir):
    plan = plan_build(_opts(tiny_model_dir, trtllm_version="1.0.0", backend="engine"))
    assert plan.backend == "engine" and any("legacy" in note for note in plan.notes)


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"trtllm_version": "0.16.0", "backend": "engine"}, UnsupportedVersionError, "guided decoding"),
        ({"trtllm_version": "0.18.2"}, UnsupportedVersionError, "tensorrtllm_backend v0.19.0"),
        ({"trtllm_version": "0.17.0", "backend": "engine"}, UnsupportedVersionError, "guided decoding"),
        ({"trtllm_version": "1.1.0"}, UnsupportedVersionError, "checked TensorRT-LLM up to 1.1.0"),
        ({"trtllm_version": "1.2.0rc1", "backend": "engine"}, UnsupportedVersionError, "checked"),
        ({"trtllm_version": "1.1.0rc0", "backend": "pytorch"}, UnsupportedVersionError, "checked"),
        ({"quantization": "fp8"}, PlanError, "local dataset"),
        ({"trtllm_version": "0.20.0", "backend": "pytorch"}, UnsupportedVersionError, "pytorch backend"),
        ({"gpu": "a100", "quantization": "fp8"}, PlanError, "FP8 needs SM"),
        ({"max_input_len": 8192, "max_seq_len": 4096}, PlanError, "max_seq_len"),
        ({"tp": 0}, PlanError, "tp and pp"),
        ({"trtllm_version": "banana"}, UnsupportedVersionError, "not a version"),
        ({"backend": "onnx"}, PlanError, "unknown backend"),
    ],
)
def test_invalid_plans_are_refused(tiny_model_dir, kw, error, match):
    with pytest.raises(error, match=match):
        plan_build(_opts(tiny_model_dir, **kw))


def test_unknown_family_on_the_engine_path(tiny_model_dir):
    _set_model_type(tiny_model_dir, "mamba2")
    with pytest.raises(UnknownModelFamilyError) as info:
        plan_build(_opts(tiny_model_dir))
    assert info.value.model_type == "mamba2" and "llama" in info.value.known


def test_engine_path_needs_a_local_checkpoint():
    with pytest.raises(PlanError, match="not a directory"):
        plan_build(BuildOptions(model="Qwen/Qwen2.5-7B-Instruct", gpu="h100", trtllm_version="0.20.0"))


def test_build_key_depends_on_sm_version_options_and_weights(tiny_model_dir):
    base = plan_build(_opts(tiny_model_dir)).key
    assert plan_build(_opts(tiny_model_dir)).key == base
    # Paths and tooling don't change the artefact.
    assert plan_build(_opts(tiny_model_dir, output_root=Path("/elsewhere"), workers=4)).key == base
    # Same SM, same engine: an H100 build serves an H200.
    assert plan_build(_opts(tiny_model_dir, gpu="h200")).key == base
    changed = {
        plan_build(_opts(tiny_model_dir, gpu="a100")).key,
        plan_build(_opts(tiny_model_dir, trtllm_version="0.19.0")).key,
        plan_build(_opts(tiny_model_dir, max_batch_size=32)).key,
        plan_build(_opts(tiny_model_dir, quantization="fp8", calib_dataset=tiny_model_dir)).key,
        plan_build(_opts(tiny_model_dir, tp=2)).key,
    }
    assert base not in changed and len(changed) == 5
    (tiny_model_dir / "model.safetensors").write_bytes(b"\x01" * 1024)
    assert plan_build(_opts(tiny_model_dir)).key != base


def test_plan_serializes_to_json(tiny_model_dir):
    import json

    data = plan_build(_opts(tiny_model_dir)).to_dict()
    assert json.loads(json.dumps(data))["steps"][1]["argv"][0] == "trtllm-build"
    assert dataclasses.is_dataclass(BuildOptions)
