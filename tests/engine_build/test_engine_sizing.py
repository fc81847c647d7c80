"""``toolrail engine plan`` sizes the GPU and the Triton task; a plan that cannot fit is refused with the numbers."""

from __future__ import annotations

import json

import pytest
from python_backend_host import RELEASES
from test_engine_build_run import FakeRunner, _console, _fake_actions

from engine_build.build import build
from engine_build.errors import DoesNotFitError
from engine_build.plan import BuildOptions, plan_build
from engine_build.sizing import BLS_PROCESS_MIB, LLMAPI_PROCESS_MIB, host_share_mib

#: Qwen2.5-7B-Instruct's config.json (the documented default model).
QWEN_7B = {
    "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN_1_5B = {**QWEN_7B, "hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "vocab_size": 151936, "tie_word_embeddings": True}


@pytest.fixture
def model_dir(tmp_path):
    def make(config, name="model"):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return path
    return make


def _plan(model, **kw):
    base = {"gpu": "h100", "trtllm_version": "1.0.0"}
    return plan_build(BuildOptions(model=str(model), **{**base, **kw}))


def test_default_model_on_h100_needs_more_than_the_old_constant(model_dir):
    sizing = _plan(model_dir(QWEN_7B)).sizing
    # 7.6 B parameters in bf16 on one GPU; KV per token 2 × 28 layers × 4 heads × 128 × 2 bytes.
    assert 14_000 < sizing.weights_per_gpu_mib < 15_000 and sizing.kv_bytes_per_token == 57_344
    assert sizing.full_sequences >= 64  # the pool holds every batch slot at max_seq_len
    assert sizing.processes == {"llmapi": {"count": 2, "mib": LLMAPI_PROCESS_MIB}}
    assert sizing.task_memory_mib > 12_288  # what terraform reserved before, whatever the model


def test_engine_flavour_bounds_the_bls_to_the_instances_memory(model_dir):
    on_h100 = _plan(model_dir(QWEN_7B, "a"), backend="engine").sizing
    assert on_h100.bls_instances == 64  # one per batch slot fits an eighth of a p5
    on_l40s = _plan(model_dir(QWEN_7B, "b"), backend="engine", gpu="l40s").sizing
    assert 1 <= on_l40s.bls_instances < 64
    assert on_l40s.processes["tensorrt_llm_bls"] == {"count": on_l40s.bls_instances, "mib": BLS_PROCESS_MIB}
    assert on_l40s.task_memory_mib <= host_share_mib("l40s", 1) == on_l40s.host_limit_mib


def test_a_task_that_cannot_fit_its_instance_is_refused_with_the_numbers(model_dir):
    with pytest.raises(DoesNotFitError, match=r"needs \d+ MiB of host memory, the l4 instance's share is 15360 MiB") as info:
        _plan(model_dir(QWEN_7B), backend="engine", gpu="l4")
    assert "weights staged 14" in str(info.value) and info.value.numbers["host_limit_mib"] == 15360


def test_weights_that_leave_no_room_for_one_sequence_are_refused(model_dir):
    with pytest.raises(DoesNotFitError, match="cannot hold the weights and one 5120-token sequence") as info:
        _plan(model_dir(QWEN_7B), gpu="t4", trtllm_version="1.0.0", task_memory_limit_mib=10**6)
    assert info.value.numbers["kv_tokens"] < 5120
    # The same model in FP8 KV and weights halves both and fits an L40S.
    assert _plan(model_dir(QWEN_7B, "fp8"), gpu="l40s", quantization="fp8").sizing.weights_per_gpu_mib < 8_000


def test_a_smaller_model_fits_the_dev_instance_with_fewer_bls_instances(model_dir):
    sizing = _plan(model_dir(QWEN_1_5B), backend="engine", gpu="l4").sizing
    assert 1 <= sizing.bls_instances < 64 and sizing.task_memory_mib <= 15360


def test_hub_ids_are_not_sized_at_plan_time():
    plan = plan_build(BuildOptions(model="Qwen/Qwen2.5-7B-Instruct", gpu="h100", trtllm_version="1.0.0"))
    assert plan.sizing is None and any("not sized" in note for note in plan.notes)


def test_plan_prints_and_serializes_the_sizing(model_dir, capsys):
    from toolrail.cli import main

    model = model_dir(QWEN_7B)
    assert main(["engine", "plan", "--model", str(model), "--gpu", "h100", "--trtllm-version", "1.0.0"]) == 0
    assert "# note: task memory" in capsys.readouterr().out
    assert main(["engine", "plan", "--model", str(model), "--gpu", "l4", "--trtllm-version", "1.0.0", "--backend", "engine",
                 "--trtllm-src", "/opt/TensorRT-LLM"]) == 2
    assert "15360 MiB" in capsys.readouterr().err
    assert main(["engine", "plan", "--model", str(model), "--gpu", "h100", "--trtllm-version", "1.0.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["sizing"]["task_memory_mib"] > 0


def test_the_repository_takes_the_plans_bls_bound(tiny_model_dir, tmp_path, capsys):
    from toolrail.cli import main

    plan = plan_build(BuildOptions(model=str(tiny_model_dir), gpu="h100", trtllm_version="0.19.0",
                                   output_root=tmp_path / "engines", task_memory_limit_mib=8192))
    assert 1 <= plan.sizing.bls_instances < 64
    build(plan, runner=FakeRunner(plan), actions=_fake_actions([]), console=_console(), check=False)
    out = tmp_path / "repo"
    assert main(["engine", "triton-repo", "--build-dir", str(plan.out_dir), "--output", str(out),
                 "--model-code-from", str(RELEASES["v0.19.0"])]) == 0
    assert f"count: {plan.sizing.bls_instances}\n" in (out / "tensorrt_llm_bls" / "config.pbtxt").read_text()
