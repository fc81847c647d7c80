"""How much memory a build needs: on each GPU (weights, runtime, KV cache) and in the Triton task (host).

The numbers terraform reserves for the Triton task (``engine.task_memory_mib``) come from here,
through the build manifest and the publish manifest, never from a constant. Host memory of a
task is the sum of

- ``tritonserver`` itself (and, for the engine flavour, the C++ ``tensorrtllm`` backend in it);
- one process per Python model instance: the BLS (``tensorrt_llm_bls/1/lib/decode.py`` imports
  torch), preprocessing and postprocessing (transformers tokenizers), or, for the LLM-API
  flavour, the ``llmapi`` stub plus one executor worker per GPU (each imports tensorrt_llm);
- the weights staged in host memory while they load: the whole engine (TensorRT deserializes
  it from a host copy), or the largest safetensors file (the PyTorch backend reads file by file);

plus :data:`HEADROOM`. Process sizes: ``import torch`` measured 265 MiB RSS and a transformers
tokenizer 295 MiB (CPU torch 2.13, this project's test machine); the image's CUDA builds map
more, so 512 MiB each is assumed. The LLM-API processes (tensorrt_llm, CUDA torch, a CUDA
context) are assumed at 4 GiB each — ``scripts/gpu_check.sh`` records the measured peak next to
this estimate. On the GPU: weights / tp, :data:`GPU_RUNTIME_MIB` plus activations for
``max_num_tokens``, and the KV pool TensorRT-LLM allocates (``kv_cache_free_gpu_mem_fraction``
of what is left), which must hold at least one ``max_seq_len`` sequence.

The BLS's ``execute()`` is synchronous, so it wants one instance per batch slot; its instance
count is bounded so the task fits its host share, and a plan that cannot fit even one instance
(or one sequence of KV cache) is refused with the numbers (:class:`DoesNotFitError`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine_build.errors import DoesNotFitError
from engine_build.gpus import GPU

__all__ = [
    "BLS_PROCESS_MIB",
    "GPU_RUNTIME_MIB",
    "HEADROOM",
    "INSTANCES",
    "LLMAPI_PROCESS_MIB",
    "ModelShape",
    "TaskSizing",
    "host_share_mib",
    "read_model_shape",
    "size_task",
    "weight_files",
]

MIB = 1 << 20
TRITON_SERVER_MIB = 1536
BLS_PROCESS_MIB = 512
TOKENIZER_PROCESS_MIB = 512
LLMAPI_PROCESS_MIB = 4096
HEADROOM = 0.10
#: CUDA context, cuBLAS/NCCL workspaces, CUDA graphs: per GPU, before activations.
GPU_RUNTIME_MIB = 2048
#: Activation bytes per (token of max_num_tokens × hidden unit), bf16 with intermediates.
_ACTIVATION_BYTES = 16
#: Memory the ECS agent and the OS keep on a container instance.
ECS_RESERVED_MIB = 1024
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}

#: The instance type that carries each GPU (terraform's ``gpu_catalog``): memory in MiB and GPUs.
INSTANCES: dict[str, dict[str, Any]] = {
    "t4": {"instance_type": "g4dn.xlarge", "memory_mib": 16384, "gpus": 1},
    "a10g": {"instance_type": "g5.xlarge", "memory_mib": 16384, "gpus": 1},
    "l4": {"instance_type": "g6.xlarge", "memory_mib": 16384, "gpus": 1},
    "l40s": {"instance_type": "g6e.xlarge", "memory_mib": 32768, "gpus": 1},
    "a100": {"instance_type": "p4d.24xlarge", "memory_mib": 1179648, "gpus": 8},
    "h100": {"instance_type": "p5.48xlarge", "memory_mib": 2097152, "gpus": 8},
    "h200": {"instance_type": "p5e.48xlarge", "memory_mib": 2097152, "gpus": 8},
}


def host_share_mib(gpu: str, gpus_per_task: int) -> int | None:
    """Host memory one task may reserve on the catalog's instance: its GPUs' share, less ECS's reserve."""
    entry = INSTANCES.get(gpu)
    if entry is None:
        return None
    return (entry["memory_mib"] - ECS_RESERVED_MIB) * gpus_per_task // entry["gpus"]


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What sizing needs from a model's ``config.json``."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    #: Parameters estimated from the shapes (used when the weights are not local).
    params: int
    #: Bytes per parameter of the checkpoint (``torch_dtype``).
    checkpoint_dtype_bytes: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape | None:
        try:
            hidden = int(config["hidden_size"])
            layers = int(config["num_hidden_layers"])
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            inter = int(config.get("intermediate_size") or 4 * hidden)
            vocab = int(config["vocab_size"])
        except (KeyError, TypeError, ValueError):
            return None
        head_dim = int(config.get("head_dim") or hidden // heads)
        embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
        per_layer = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * inter
        return cls(
            num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden,
            params=embeddings + layers * per_layer,
            checkpoint_dtype_bytes=_DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype")), 2),
        )


def read_model_shape(model_dir: Path) -> ModelShape | None:
    """The shape from ``model_dir/config.json``; None when there is none or it lacks the fields."""
    config = model_dir / "config.json"
    if not config.is_file():
        return None
    return ModelShape.from_config(json.loads(config.read_text()))


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of an HF model directory."""
    return sorted(model_dir.glob("*.safetensors"))


@dataclass(frozen=True, kw_only=True)
class TaskSizing:
    """Every number behind ``task_memory_mib``; :meth:`to_dict` goes into the manifests."""

    backend: str
    gpu: str
    tp: int
    gpu_memory_mib: int
    weights_per_gpu_mib: int
    gpu_runtime_mib: int
    kv_cache_mib: int
    kv_bytes_per_token: int
    kv_tokens: int
    full_sequences: int
    host_limit_mib: int | None
    host_weights_mib: int
    processes: dict[str, dict[str, int]] = field(default_factory=dict)
    bls_instances: int | None = None
    task_memory_mib: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        procs = ", ".join(f"{name} {p['count']}×{p['mib']} MiB" for name, p in self.processes.items())
        return (
            f"task memory {self.task_memory_mib} MiB (limit {self.host_limit_mib}): {procs}, weights staged "
            f"{self.host_weights_mib} MiB; GPU: weights {self.weights_per_gpu_mib} + runtime {self.gpu_runtime_mib} "
            f"+ KV {self.kv_cache_mib} of {self.gpu_memory_mib} MiB = {self.kv_tokens} tokens, "
            f"{self.full_sequences} full sequences"
        )


def _host_total(fixed_mib: int, processes: Mapping[str, Mapping[str, int]]) -> int:
    used = fixed_mib + sum(p["count"] * p["mib"] for p in processes.values())
    return int(math.ceil(used * (1 + HEADROOM) / 256) * 256)


def size_task(
    *,
    backend: str,
    gpu: GPU,
    shape: ModelShape,
    weight_bytes: int,
    largest_file_bytes: int,
    tp: int,
    max_batch_size: int,
    max_seq_len: int,
    max_num_tokens: int,
    kv_cache_free_gpu_mem_fraction: float,
    kv_dtype_bytes: int = 2,
    host_limit_mib: int | None = None,
    bls_instances: int | None = None,
    tokenizer_instances: int = 1,
) -> TaskSizing:
    """Size one Triton task; raise :class:`DoesNotFitError` (with the numbers) when it cannot fit.

    ``weight_bytes`` is what the GPUs hold (the engine, or the checkpoint as served);
    ``bls_instances`` None picks the most that fit, up to ``max_batch_size``.
    """
    weights_per_gpu = math.ceil(weight_bytes / tp / MIB)
    runtime = GPU_RUNTIME_MIB + math.ceil(max_num_tokens * shape.hidden_size * _ACTIVATION_BYTES / MIB)
    free = gpu.memory_gib * 1024 - weights_per_gpu - runtime
    kv_bytes_per_token = 2 * shape.num_layers * math.ceil(shape.num_kv_heads / tp) * shape.head_dim * kv_dtype_bytes
    kv_cache = max(0, int(free * kv_cache_free_gpu_mem_fraction))
    kv_tokens = kv_cache * MIB // kv_bytes_per_token
    full_sequences = kv_tokens // max_seq_len
    numbers: dict[str, Any] = {
        "gpu_memory_mib": gpu.memory_gib * 1024, "weights_per_gpu_mib": weights_per_gpu, "gpu_runtime_mib": runtime,
        "kv_cache_mib": kv_cache, "kv_tokens": kv_tokens, "max_seq_len": max_seq_len,
    }
    if full_sequences < 1:
        raise DoesNotFitError(
            f"{gpu.name} ({gpu.memory_gib} GiB) cannot hold the weights and one {max_seq_len}-token sequence of KV cache "
            f"(weights {weights_per_gpu} MiB + runtime {runtime} MiB per GPU leaves a {kv_cache} MiB KV pool = "
            f"{kv_tokens} tokens): raise tp, quantize, or lower max_seq_len",
            numbers,
        )
    if backend == "engine":
        host_weights = math.ceil(weight_bytes / MIB)
        processes = {
            "preprocessing": {"count": tokenizer_instances, "mib": TOKENIZER_PROCESS_MIB},
            "postprocessing": {"count": tokenizer_instances, "mib": TOKENIZER_PROCESS_MIB},
        }
        fixed = TRITON_SERVER_MIB + host_weights
        if bls_instances is None:
            bls_instances = max_batch_size
            if host_limit_mib is not None:
                room = host_limit_mib / (1 + HEADROOM) - fixed - 2 * tokenizer_instances * TOKENIZER_PROCESS_MIB
                bls_instances = max(0, min(max_batch_size, int(room // BLS_PROCESS_MIB)))
        processes["tensorrt_llm_bls"] = {"count": max(bls_instances, 1), "mib": BLS_PROCESS_MIB}
    else:
        host_weights = math.ceil(largest_file_bytes / MIB)
        fixed = TRITON_SERVER_MIB + host_weights
        processes = {"llmapi": {"count": 1 + tp, "mib": LLMAPI_PROCESS_MIB}}
        bls_instances = None
    total = _host_total(fixed, processes)
    numbers.update(task_memory_mib=total, host_limit_mib=host_limit_mib, host_weights_mib=host_weights,
                   processes=processes)
    if (bls_instances is not None and bls_instances < 1) or (host_limit_mib is not None and total > host_limit_mib):
        raise DoesNotFitError(
            f"the Triton task needs {total} MiB of host memory, the {gpu.name} instance's share is {host_limit_mib} MiB "
            f"(server {TRITON_SERVER_MIB} + weights staged {host_weights} + "
            + " + ".join(f"{name} {p['count']}×{p['mib']}" for name, p in processes.items())
            + f", +{int(HEADROOM * 100)} %): use a larger instance, quantize, or lower the batch size",
            numbers,
        )
    return TaskSizing(
        backend=backend, gpu=gpu.name, tp=tp, gpu_memory_mib=gpu.memory_gib * 1024, weights_per_gpu_mib=weights_per_gpu,
        gpu_runtime_mib=runtime, kv_cache_mib=kv_cache, kv_bytes_per_token=kv_bytes_per_token, kv_tokens=kv_tokens,
        full_sequences=full_sequences, host_limit_mib=host_limit_mib, host_weights_mib=host_weights,
        processes=processes, bls_instances=bls_instances, task_memory_mib=total,
    )
