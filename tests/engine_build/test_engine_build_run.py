from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from engine_build.build import build, load_matrix, preflight
from engine_build.errors import BuildStepError, PlanError, TensorRTLLMNotInstalledError
from engine_build.manifest import MANIFEST_NAME, Manifest
from engine_build.plan import BuildOptions, plan_build
from toolrail.cli import main as toolrail_main


class FakeRunner:
    """Stands in for the GPU tools: creates each step's output and streams a few log lines."""

    def __init__(self, plan, fail_step: str | None = None):
        self.plan = plan
        self.fail_step = fail_step
        self.calls: list[list[str]] = []

    def __call__(self, argv, *, sink, env=None):
        self.calls.append(list(argv))
        name = "trtllm-build" if argv[0] == "trtllm-build" else "convert"
        sink(f"[fake] running {name}")
        if name == self.fail_step:
            sink("[fake] out of memory")
            return 3
        out = Path(argv[list(argv).index("--output_dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / ("rank0.engine" if name == "trtllm-build" else "rank0.safetensors")).write_bytes(name.encode() * 64)
        (out / "config.json").write_text(json.dumps({"step": name}))
        return 0


def _fake_actions(calls: list[str]):
    def tokenizer_info(plan):
        calls.append("tokenizer_info")
        plan.tokenizer_info_path.parent.mkdir(parents=True, exist_ok=True)
        plan.tokenizer_info_path.write_text("{}")

    def llm_api_options(plan):
        calls.append("llm_api_options")
        plan.llm_api_options_path.write_text("guided_decoding_backend: xgrammar\n")

    return {"tokenizer_info": tokenizer_info, "llm_api_options": llm_api_options}


def _console():
    return Console(file=io.StringIO(), width=120)


@pytest.fixture
def engine_plan(tiny_model_dir, tmp_path):
    return plan_build(BuildOptions(model=str(tiny_model_dir), gpu="h100", trtllm_version="0.20.0", output_root=tmp_path / "engines"))


def test_build_runs_steps_writes_manifest_then_hits_cache(engine_plan):
    runner, actions = FakeRunner(engine_plan), []
    console = _console()
    result = build(engine_plan, runner=runner, actions=_fake_actions(actions), console=console, check=False)
    assert not result.cache_hit
    assert [c[0] for c in runner.calls] == ["python3", "trtllm-build"] and actions == ["tokenizer_info"]
    manifest = Manifest.read(engine_plan.out_dir)
    assert manifest.key == engine_plan.key and manifest.sm == 90 and manifest.trtllm_version == "0.20.0"
    assert manifest.model_fingerprint.startswith("sha256:")
    assert set(manifest.files) == {
        "checkpoint/config.json", "checkpoint/rank0.safetensors", "engine/config.json", "engine/rank0.engine",
        "tokenizer_info/xgrammar_tokenizer_info.json",
    }
    assert manifest.commands == engine_plan.commands()
    # Streamed logs reach the console and the step's log file.
    assert "[fake] running trtllm-build" in console.file.getvalue()
    assert "[fake] running convert" in (engine_plan.out_dir / "logs" / "convert.log").read_text()

    again = FakeRunner(engine_plan)
    hit = build(engine_plan, runner=again, actions=_fake_actions([]), console=_console(), check=False)
    assert hit.cache_hit and again.calls == [] and hit.manifest.key == engine_plan.key


def test_a_changed_output_file_is_not_a_cache_hit(engine_plan):
    build(engine_plan, runner=FakeRunner(engine_plan), actions=_fake_actions([]), console=_console(), check=False)
    (engine_plan.engine_dir / "rank0.engine").write_bytes(b"tampered")
    runner = FakeRunner(engine_plan)
    result = build(engine_plan, runner=runner, actions=_fake_actions([]), console=_console(), check=False)
    assert not result.cache_hit and len(runner.calls) == 2


def test_failing_step_raises_with_its_log(engine_plan):
    with pytest.raises(BuildStepError) as info:
        build(engine_plan, runner=FakeRunner(engine_plan, fail_step="trtllm-build"), actions=_fake_actions([]),
              console=_console(), check=False)
    assert info.value.step == "trtllm-build" and info.value.returncode == 3
    assert "out of memory" in info.value.log_path.read_text()
    assert not (engine_plan.out_dir / MANIFEST_NAME).exists()


def test_pytorch_build_has_no_subprocess_and_writes_only_what_the_llm_api_reads(tiny_model_dir, tmp_path):
    plan = plan_build(BuildOptions(model=str(tiny_model_dir), gpu="h200", trtllm_version="1.0.0", output_root=tmp_path))
    runner, calls = FakeRunner(plan), []
    result = build(plan, runner=runner, actions=_fake_actions(calls), console=_console(), check=False)
    # The LLM API builds its own grammar tokenizer info from the tokenizer: no tokenizer-info file.
    assert runner.calls == [] and calls == ["llm_api_options"]
    assert result.manifest.backend == "pytorch"


def test_real_tokenizer_info_action(engine_plan, tiny_model_dir, tmp_path):
    build(engine_plan, runner=FakeRunner(engine_plan), console=_console(), check=False)
    info = json.loads(engine_plan.tokenizer_info_path.read_text())
    assert info["stop_token_ids"] == [2, 0]  # eos, then generation_config's extra stop id
    plan = plan_build(BuildOptions(model=str(tiny_model_dir), gpu="h200", trtllm_version="1.0.0", output_root=tmp_path))
    build(plan, console=_console(), check=False)
    options = plan.llm_api_options_path.read_text()
    assert "guided_decoding_backend: xgrammar" in options and "disable_overlap_scheduler: true" in options
    assert not plan.tokenizer_info_path.exists()


def test_preflight_names_missing_tensorrt_llm(engine_plan):
    with pytest.raises(TensorRTLLMNotInstalledError, match="tensorrt_llm"):
        preflight(engine_plan)


def test_matrix_yaml(tmp_path, tiny_model_dir):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f"defaults: {{trtllm_version: '0.20.0', output_root: {tmp_path / 'out'}}}\n"
        f"builds:\n  - {{model: {tiny_model_dir}, gpu: h100}}\n  - {{model: {tiny_model_dir}, gpu: l40s, quantization: fp8}}\n"
    )
    options = load_matrix(matrix)
    assert [(o.gpu, o.quantization) for o in options] == [("h100", "none"), ("l40s", "fp8")]
    assert options[0].output_root == tmp_path / "out"
    matrix.write_text("builds:\n  - {model: x, gpu: h100, trtllm_version: '0.20.0', color: red}\n")
    with pytest.raises(PlanError, match="unknown fields"):
        load_matrix(matrix)
    matrix.write_text("builds: []\n")
    with pytest.raises(PlanError, match="non-empty"):
        load_matrix(matrix)


def test_cli_plan_json_and_exit_codes(tiny_model_dir, capsys, tmp_path):
    assert toolrail_main(["engine", "plan", "--model", str(tiny_model_dir), "--gpu", "h100", "--trtllm-version", "0.20.0", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert plans[0]["gpu"] == {"name": "h100", "sm": 90, "arch": "hopper"}
    assert toolrail_main(["engine", "plan", "--model", str(tiny_model_dir), "--gpu", "voodoo", "--trtllm-version", "0.20.0"]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert toolrail_main(["engine", "plan", "--gpu", "h100"]) == 2
    assert "--model" in capsys.readouterr().err
    code = toolrail_main(["engine", "build", "--model", str(tiny_model_dir), "--gpu", "h100", "--trtllm-version", "0.20.0",
                          "--output-root", str(tmp_path)])
    assert code == 2 and "tensorrt_llm" in capsys.readouterr().err
    assert toolrail_main(["engine", "build", "--model", str(tiny_model_dir), "--gpu", "h100", "--trtllm-version", "0.20.0",
                          "--output-root", str(tmp_path), "--dry-run"]) == 0
