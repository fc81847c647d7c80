"""Export an HF model directory saved by transformers 5 in the layout transformers 4.x reads.

TensorRT-LLM (1.0.0 in the 25.10 Triton image) pins transformers 4.x. A directory saved by
transformers 5 differs where 4.x looks:

- ``config.json`` keeps RoPE settings in ``rope_parameters``; 4.x reads ``rope_theta`` (and
  ``rope_scaling``) at the top level and silently falls back to its default (10000 for llama)
  when absent — SmolLM2 needs 100000. Also ``dtype`` was ``torch_dtype``.
- ``tokenizer_config.json`` names ``tokenizer_class: TokenizersBackend``, a class 4.x does not
  have; the same ``tokenizer.json`` loads there as ``PreTrainedTokenizerFast``. 5-only keys
  (``backend``, ``is_local``, ``local_files_only``) are dropped; the chat template is also
  written inline (``chat_template``) for 4.x releases that do not read ``chat_template.jinja``.

Weights are copied unchanged (safetensors tensor names are the same).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_build.errors import EngineBuildError

__all__ = ["HF4_TOKENIZER_CLASS", "ExportError", "export_hf4", "hf4_config", "hf4_tokenizer_config"]

#: The fast tokenizer class every transformers 4.x has; it loads any ``tokenizer.json``.
HF4_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
#: transformers 5 tokenizer classes that are the generic tokenizers-backed one under another name.
_V5_GENERIC_TOKENIZERS = {"TokenizersBackend"}
_V5_ONLY_TOKENIZER_KEYS = ("backend", "is_local", "local_files_only")


class ExportError(EngineBuildError):
    """The model directory cannot be exported."""


def hf4_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` as transformers 4.x reads it (RoPE at the top level, ``torch_dtype``)."""
    out = dict(config)
    rope = out.pop("rope_parameters", None)
    if isinstance(rope, dict):
        # Per-layer-type RoPE (a dict of dicts) has no 4.x form.
        if any(isinstance(value, dict) for value in rope.values()):
            raise ExportError("rope_parameters per layer type have no transformers 4.x equivalent")
        if "rope_theta" in rope:
            out["rope_theta"] = rope["rope_theta"]
        scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
        if scaling.get("rope_type", "default") != "default":
            out["rope_scaling"] = scaling
    if "dtype" in out and "torch_dtype" not in out:
        out["torch_dtype"] = out.pop("dtype")
    return out


def hf4_tokenizer_config(config: dict[str, Any], *, chat_template: str | None = None) -> dict[str, Any]:
    """``tokenizer_config.json`` as transformers 4.x reads it."""
    out = {key: value for key, value in config.items() if key not in _V5_ONLY_TOKENIZER_KEYS}
    if out.get("tokenizer_class") in _V5_GENERIC_TOKENIZERS:
        out["tokenizer_class"] = HF4_TOKENIZER_CLASS
    if chat_template and "chat_template" not in out:
        out["chat_template"] = chat_template
    return out


def export_hf4(source: Path, target: Path, *, log: Callable[[str], None] = lambda _line: None) -> Path:
    """Write ``source`` to ``target`` in the transformers 4.x layout; returns ``target``."""
    if not (source / "config.json").is_file():
        raise ExportError(f"{source} has no config.json")
    if not (source / "tokenizer.json").is_file():
        raise ExportError(f"{source} has no tokenizer.json (a fast tokenizer is what 4.x can load from it)")
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in {"config.json", "tokenizer_config.json"}:
            shutil.copy2(path, target / path.name)
            log(f"copied {path.name}")
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(hf4_config(config), indent=2, sort_keys=True) + "\n")
    tokenizer_config_path = source / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text()) if tokenizer_config_path.is_file() else {}
    template_path = source / "chat_template.jinja"
    template = template_path.read_text() if template_path.is_file() else None
    (target / "tokenizer_config.json").write_text(
        json.dumps(hf4_tokenizer_config(tokenizer_config, chat_template=template), indent=2, sort_keys=True) + "\n"
    )
    log(f"wrote {target} (transformers 4.x layout)")
    return target
