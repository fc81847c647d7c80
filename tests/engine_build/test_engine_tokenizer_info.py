from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from engine_build.errors import TokenizerInfoError
from engine_build.tokenizer_info import (
    XGRAMMAR_SERIALIZED_NAME,
    build_tokenizer_info,
    load_tokenizer_info,
    write_tokenizer_info,
)

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
})


def _assert_round_trip(tokenizer, tmp_path):
    path = write_tokenizer_info(tokenizer, tmp_path)
    data = json.loads(path.read_text())
    vocab = tokenizer.get_vocab()
    assert len(data["encoded_vocab"]) == len(vocab)
    assert all(vocab[token] == index for index, token in enumerate(data["encoded_vocab"]))
    assert data["stop_token_ids"] == [tokenizer.eos_token_id]

    reference = xgr.TokenizerInfo.from_huggingface(tokenizer)
    loaded = load_tokenizer_info(path)
    assert loaded.vocab_type == reference.vocab_type
    assert loaded.add_prefix_space == reference.add_prefix_space
    assert loaded.decoded_vocab == reference.decoded_vocab
    assert loaded.stop_token_ids == reference.stop_token_ids
    serialized = xgr.TokenizerInfo.deserialize_json((tmp_path / XGRAMMAR_SERIALIZED_NAME).read_text())
    assert serialized.decoded_vocab == reference.decoded_vocab and serialized.vocab_type == reference.vocab_type
    return loaded


def _matcher_accepts(info, tokenizer, text: str) -> bool:
    compiled = xgr.GrammarCompiler(info).compile_json_schema(SCHEMA)
    matcher = xgr.GrammarMatcher(compiled)
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.accept_token(token):
            return False
    return matcher.accept_token(tokenizer.eos_token_id)


def test_tiny_tokenizer_round_trip_and_grammar(tiny_tokenizer, tmp_path):
    loaded = _assert_round_trip(tiny_tokenizer, tmp_path)
    assert _matcher_accepts(loaded, tiny_tokenizer, '{"city": "Paris", "unit": "celsius"}')
    assert not _matcher_accepts(loaded, tiny_tokenizer, '{"city": "Paris", "unit": "kelvin"}')


def test_smollm2_tokenizer_round_trip(smollm2_tokenizer, tmp_path):
    loaded = _assert_round_trip(smollm2_tokenizer, tmp_path)
    assert loaded.vocab_size == 49152
    assert _matcher_accepts(loaded, smollm2_tokenizer, '{"city": "北京", "unit": "celsius"}')


def test_sparse_vocabulary_is_refused():
    class Sparse:
        eos_token_id = 0

        def get_vocab(self):
            return {"a": 0, "b": 2}

    with pytest.raises(TokenizerInfoError, match="not dense"):
        build_tokenizer_info(Sparse())


def test_slow_tokenizer_is_refused():
    class Slow:
        eos_token_id = 0

        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(TokenizerInfoError, match="fast"):
        build_tokenizer_info(Slow())


def test_missing_fields_are_refused(tmp_path):
    path = tmp_path / "info.json"
    path.write_text(json.dumps({"encoded_vocab": ["a"]}))
    with pytest.raises(TokenizerInfoError, match="lacks"):
        load_tokenizer_info(path)
