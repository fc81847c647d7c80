"""``toolrail engine export-hf4``: a transformers-5 model dir in the layout TensorRT-LLM's transformers 4.x reads."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine_build.hf_export import (
    HF4_TOKENIZER_CLASS,
    ExportError,
    export_hf4,
    hf4_config,
)

# As transformers 5.24 saved the default model (SmolLM2-135M-Instruct converted from GGUF).
V5_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16", "hidden_size": 576,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "transformers_version": "5.24.0",
}


@pytest.fixture
def v5_model(tiny_model_dir: Path) -> Path:
    (tiny_model_dir / "config.json").write_text(json.dumps(V5_CONFIG))
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="TokenizersBackend", backend="tokenizers", is_local=True, local_files_only=True)
    (tiny_model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (tiny_model_dir / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return tiny_model_dir


def test_export_puts_rope_theta_and_a_4x_tokenizer_class_where_4x_reads_them(v5_model, tmp_path):
    out = export_hf4(v5_model, tmp_path / "hf4")
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and "rope_parameters" not in config and "rope_scaling" not in config
    assert config["torch_dtype"] == "bfloat16"
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == HF4_TOKENIZER_CLASS
    assert not {"backend", "is_local", "local_files_only"} & tokenizer_config.keys()
    assert tokenizer_config["chat_template"].startswith("{% for m")
    assert (out / "model.safetensors").read_bytes() == (v5_model / "model.safetensors").read_bytes()
    # The class named is one every transformers has, and the exported dir still loads here (5.x).
    import transformers

    assert hasattr(transformers, HF4_TOKENIZER_CLASS)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.decode(tokenizer.encode("北京明天天气", add_special_tokens=False)) == "北京明天天气"


def test_scaled_rope_becomes_rope_scaling():
    config = hf4_config({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}})
    assert config["rope_theta"] == 500000.0
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    with pytest.raises(ExportError, match="per layer type"):
        hf4_config({"rope_parameters": {"full_attention": {"rope_theta": 1.0}}})


@pytest.mark.skipif(not os.environ.get("TOOLRAIL_HF4_PYTHON"), reason="set TOOLRAIL_HF4_PYTHON to a python with transformers 4.x")
def test_transformers_4x_loads_the_export(v5_model, tmp_path):
    """With a real transformers 4.x: the v5 dir fails (or loses rope_theta), the export loads right."""
    out = export_hf4(v5_model, tmp_path / "hf4")
    script = (
        "import json,sys\nfrom transformers import AutoConfig, AutoTokenizer\n"
        "c = AutoConfig.from_pretrained(sys.argv[1]); t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "print(json.dumps({'rope_theta': c.rope_theta, 'tokenizer': type(t).__name__}))\n"
    )
    result = subprocess.run([os.environ["TOOLRAIL_HF4_PYTHON"], "-c", script, str(out)], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"rope_theta": 100000.0, "tokenizer": "PreTrainedTokenizerFast"}
    original = subprocess.run([os.environ["TOOLRAIL_HF4_PYTHON"], "-c", script, str(v5_model)], capture_output=True, text=True,
                              check=False)
    assert original.returncode != 0 and "TokenizersBackend" in original.stderr


def test_cli_export(v5_model, tmp_path, capsys):
    from toolrail.cli import main

    assert main(["engine", "export-hf4", "--model", str(v5_model), "--output", str(tmp_path / "o")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["engine", "export-hf4", "--model", str(tmp_path / "nothing"), "--output", str(tmp_path / "p")]) == 1
    assert "has no config.json" in capsys.readouterr().err
