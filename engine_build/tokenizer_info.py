"""The xgrammar tokenizer-info file for TensorRT-LLM's C++ guided-decoding backend.

The C++ backend reads ``xgrammar_tokenizer_info_path``: a JSON object with the encoded
vocabulary (token strings in id order), the HF ``tokenizer.json`` string (xgrammar
detects the vocab type and prefix-space handling from it) and the stop token ids.
Without it, guided decoding on the C++ backend is silently skipped. We also write
xgrammar's own serialization next to it, which the Python side loads without a tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine_build.errors import TokenizerInfoError

__all__ = [
    "TOKENIZER_INFO_NAME",
    "XGRAMMAR_SERIALIZED_NAME",
    "build_tokenizer_info",
    "load_tokenizer_info",
    "stop_token_ids_for",
    "write_tokenizer_info",
]

TOKENIZER_INFO_NAME = "xgrammar_tokenizer_info.json"
XGRAMMAR_SERIALIZED_NAME = "xgrammar_tokenizer_info.serialized.json"


def _backend_str(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise TokenizerInfoError(
            f"{type(tokenizer).__name__} is not a fast (tokenizers-backed) tokenizer; the C++ backend needs tokenizer.json"
        )
    return backend.to_str()


def stop_token_ids_for(tokenizer: Any, model_dir: Path | None = None) -> list[int]:
    """EOS of the tokenizer plus the ``eos_token_id`` list of ``generation_config.json`` (instruct models stop on both)."""
    ids: list[int] = []

    def add(values: Iterable[int] | int | None) -> None:
        if values is None:
            return
        for value in [values] if isinstance(values, int) else values:
            if isinstance(value, int) and value not in ids:
                ids.append(value)

    add(getattr(tokenizer, "eos_token_id", None))
    if model_dir is not None and (model_dir / "generation_config.json").is_file():
        add(json.loads((model_dir / "generation_config.json").read_text()).get("eos_token_id"))
    if not ids:
        raise TokenizerInfoError("the tokenizer has no eos token and no stop ids were given")
    return ids


def build_tokenizer_info(tokenizer: Any, *, stop_token_ids: list[int] | None = None) -> dict[str, Any]:
    """The C++ backend's tokenizer-info object for a HF fast tokenizer."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    # The list index is the token id on the C++ side: a hole would shift every later token.
    for index, (token, token_id) in enumerate(by_id):
        if token_id != index:
            raise TokenizerInfoError(f"vocabulary ids are not dense: id {token_id} at position {index} ({token!r})")
    return {
        "encoded_vocab": [token for token, _ in by_id],
        "tokenizer_str": _backend_str(tokenizer),
        "stop_token_ids": list(stop_token_ids) if stop_token_ids is not None else stop_token_ids_for(tokenizer),
    }


def write_tokenizer_info(
    tokenizer: Any, out_dir: Path, *, stop_token_ids: list[int] | None = None, vocab_size: int | None = None
) -> Path:
    """Write both tokenizer-info files into ``out_dir``; returns the C++ backend's file."""
    import xgrammar as xgr

    info = build_tokenizer_info(tokenizer, stop_token_ids=stop_token_ids)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TOKENIZER_INFO_NAME
    path.write_text(json.dumps(info, ensure_ascii=False))
    xgr_info = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=info["stop_token_ids"]
    )
    (out_dir / XGRAMMAR_SERIALIZED_NAME).write_text(xgr_info.serialize_json())
    return path


def load_tokenizer_info(path: Path) -> Any:
    """Rebuild an ``xgrammar.TokenizerInfo`` from a tokenizer-info file, as the C++ backend does."""
    import xgrammar as xgr

    data = json.loads(path.read_text())
    missing = {"encoded_vocab", "tokenizer_str", "stop_token_ids"} - data.keys()
    if missing:
        raise TokenizerInfoError(f"{path} lacks {sorted(missing)}")
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(data["tokenizer_str"])
    return xgr.TokenizerInfo(
        data["encoded_vocab"],
        metadata["vocab_type"],
        stop_token_ids=data["stop_token_ids"],
        add_prefix_space=metadata["add_prefix_space"],
    )
