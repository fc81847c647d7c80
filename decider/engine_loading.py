"""Loading the embedded engine's model: the device, the dtype modes, the weights and their decode-step copy."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from decider.model import resolve_model_path

__all__ = ["DTYPE_MODES", "decode_weights", "eos_ids", "load_pretrained", "native_bf16", "resolve_dtype"]

#: ``dtype`` names :meth:`EmbeddedEngine.load` accepts, as (weights dtype, decode-step dtype).
DTYPE_MODES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "float32": (torch.float32, torch.float32),
    "fp32": (torch.float32, torch.float32),
    "bfloat16": (torch.bfloat16, torch.bfloat16),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "float16": (torch.float16, torch.float16),
    "fp16": (torch.float16, torch.float16),
    "hybrid": (torch.float32, torch.bfloat16),
    # Experimental, CPU only: decode steps on Linear layers dynamically quantized to int8
    # (~25 % faster decode than "hybrid"); logits shift. With jump-forward it kept dev-split exact
    # calls at 96.8 % for a 1.10 s vs 1.13 s median decision: too little to make it the default.
    "hybrid-int8": (torch.float32, torch.qint8),
}


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls run natively (GPUs; CPUs with AVX512-BF16 or AMX), not emulated."""
    if device.type != "cpu":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> tuple[torch.dtype, torch.dtype]:
    """``(weights dtype, decode-step dtype)`` for a ``dtype`` argument of :meth:`EmbeddedEngine.load`.

    ``None``/``"auto"``: bf16 where it is native; elsewhere (AVX2 CPUs) ``"hybrid"``, because
    emulated bf16 makes prefill ~6x slower than fp32 (200 tokens: 5.1 s vs 0.8 s at one thread)
    while a decode step, bound by memory bandwidth, is still ~20 % faster with half-size weights
    (66 vs 81 ms/token). Dev-split decisions were identical to all-bf16 ones, greedy tokens matched
    fp32 in the tests; the price is a second copy of the weights (+270 MB for SmolLM2-135M).
    """
    if isinstance(dtype, torch.dtype):
        return dtype, dtype
    if dtype is None or dtype == "auto":
        return DTYPE_MODES["bfloat16"] if native_bf16(device) else DTYPE_MODES["hybrid"]
    try:
        return DTYPE_MODES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use auto, {', '.join(DTYPE_MODES)}") from None


def load_pretrained(model_path: str | Path | None, device: str | torch.device | None, dtype: str | torch.dtype | None,
                    *, num_threads: int | None = None) -> tuple[Any, Any, Path, torch.device, torch.dtype]:
    """``(model, tokenizer, path, device, decode dtype)`` of a local HF model directory (``EmbeddedEngine.load``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy; only a load needs it
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 - as above

    if num_threads:
        torch.set_num_threads(num_threads)
    path = resolve_model_path(model_path)
    torch_device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    torch_dtype, decode_dtype = resolve_dtype(dtype, torch_device)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar, on every process start
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return model.to(torch_device).eval(), tokenizer, path, torch_device, decode_dtype


def decode_weights(model: Any, decode_dtype: torch.dtype) -> tuple[Any | None, torch.dtype]:
    """``(a copy of the weights for decode steps, or None; the KV cache's dtype)`` to decode in ``decode_dtype``."""
    dtype = next(model.parameters()).dtype
    if decode_dtype == torch.qint8:
        # Linear layers dynamically quantized to int8 (fp32 activations, CPU only).
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear},
                                                      dtype=torch.qint8).eval(), dtype
    if decode_dtype != dtype:
        # A second copy of the weights for decode steps; deepcopy keeps tied embeddings tied.
        return copy.deepcopy(model).to(decode_dtype).eval(), torch.promote_types(dtype, decode_dtype)
    return None, dtype


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every end-of-sequence token id the model's config, its generation config and the tokenizer name."""
    ids: set[int] = set()
    candidates = [getattr(model.config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)]
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        candidates.append(getattr(generation_config, "eos_token_id", None))
    for value in candidates:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(item) for item in value)
    return ids
