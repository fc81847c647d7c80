"""Write a complete Triton model repository for a build, guided decoding on, every parameter filled.

Two flavors:

- ``engine``: the inflight-batching layout (``preprocessing`` → ``tensorrt_llm`` →
  ``postprocessing``, an ``ensemble`` of the three, and ``tensorrt_llm_bls``, the model the
  decider talks to). ``tensorrt_llm`` runs the engine on the C++ ``tensorrtllm`` backend with
  ``guided_decoding_backend: xgrammar`` and the tokenizer-info file generated here.
  The Python model code of preprocessing/postprocessing/BLS belongs to the pinned
  TensorRT-LLM release: it is copied from that release's ``all_models/inflight_batcher_llm``
  (``model_code_from``), whose templates also give the tensor interfaces.
- ``pytorch``: one Python model, ``llmapi``, serving the LLM API (PyTorch backend) with
  toolrail's own model code (``engine_build/llmapi_model.py``): the same tensors as the BLS
  model, guided decoding through ``GuidedDecodingParams``.

Configs are built as ``ModelConfig`` protobufs and printed with ``text_format``, so they
parse by construction; :func:`write_triton_repo` parses them back and checks them against
the client's tensor table before returning.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from engine_build.config_check import (
    CLIENT_INPUTS,
    CLIENT_OUTPUTS,
    GUIDED_DECODING_BACKEND,
    load_repository,
    require_servable,
)
from engine_build.manifest import hash_tree
from engine_build.tokenizer_info import TOKENIZER_INFO_NAME, write_tokenizer_info
from engine_build.triton_interfaces import INTERFACES, TensorRow

__all__ = [
    "ENGINE_ENTRY_MODEL",
    "LLMAPI_MODEL",
    "REPO_MANIFEST_NAME",
    "RepoOptions",
    "RepoResult",
    "build_configs",
    "write_triton_repo",
]

ENGINE_ENTRY_MODEL = "tensorrt_llm_bls"
LLMAPI_MODEL = "llmapi"
REPO_MANIFEST_NAME = "toolrail_repo_manifest.json"
_CODE_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")
_EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"

# Ensemble wiring: step model → (input_map {step input: ensemble tensor}, output_map {step output: ensemble tensor}).
_ENSEMBLE_STEPS: tuple[tuple[str, dict[str, str], dict[str, str]], ...] = (
    (
        "preprocessing",
        {
            "QUERY": "text_input",
            "DECODER_QUERY": "decoder_text_input",
            "REQUEST_OUTPUT_LEN": "max_tokens",
            "BAD_WORDS_DICT": "bad_words",
            "STOP_WORDS_DICT": "stop_words",
            "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
            "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
            "END_ID": "end_id",
            "PAD_ID": "pad_id",
            "PROMPT_TABLE_EXTRA_ID": "prompt_table_extra_id",
        },
        {
            "INPUT_ID": "_INPUT_ID",
            "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
            "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
            "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN",
            "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
            "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
            "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
            "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
            "OUT_END_ID": "_PREPROCESSOR_END_ID",
            "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
            "OUT_PROMPT_TABLE_EXTRA_IDS": "_OUT_PROMPT_TABLE_EXTRA_IDS",
        },
    ),
    (
        "tensorrt_llm",
        {
            "input_ids": "_INPUT_ID",
            "decoder_input_ids": "_DECODER_INPUT_ID",
            "input_lengths": "_REQUEST_INPUT_LEN",
            "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
            "exclude_input_in_output": "exclude_input_in_output",
            "request_output_len": "_REQUEST_OUTPUT_LEN",
            "end_id": "_PREPROCESSOR_END_ID",
            "pad_id": "_PREPROCESSOR_PAD_ID",
            "embedding_bias": "_EMBEDDING_BIAS",
            "runtime_top_k": "top_k",
            "runtime_top_p": "top_p",
            "temperature": "temperature",
            "len_penalty": "length_penalty",
            "repetition_penalty": "repetition_penalty",
            "min_tokens": "min_tokens",
            "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty",
            "seed": "seed",
            "return_log_probs": "return_log_probs",
            "return_context_logits": "return_context_logits",
            "return_generation_logits": "return_generation_logits",
            "return_perf_metrics": "return_perf_metrics",
            "num_return_sequences": "num_return_sequences",
            "beam_width": "beam_width",
            "streaming": "stream",
            "prompt_embedding_table": "prompt_embedding_table",
            "prompt_vocab_size": "prompt_vocab_size",
            "prompt_table_extra_ids": "_OUT_PROMPT_TABLE_EXTRA_IDS",
            "stop_words_list": "_STOP_WORDS_IDS",
            "bad_words_list": "_BAD_WORDS_IDS",
            "lora_task_id": "lora_task_id",
            "lora_weights": "lora_weights",
            "lora_config": "lora_config",
            "guided_decoding_guide_type": "guided_decoding_guide_type",
            "guided_decoding_guide": "guided_decoding_guide",
        },
        {
            "output_ids": "_TOKENS_BATCH",
            "sequence_length": "_SEQUENCE_LENGTH",
            "cum_log_probs": "cum_log_probs",
            "output_log_probs": "output_log_probs",
            "context_logits": "context_logits",
            "generation_logits": "generation_logits",
            "batch_index": "batch_index",
            "sequence_index": "sequence_index",
            "kv_cache_alloc_new_blocks": "kv_cache_alloc_new_blocks",
            "kv_cache_reused_blocks": "kv_cache_reused_blocks",
            "kv_cache_alloc_total_blocks": "kv_cache_alloc_total_blocks",
            "arrival_time_ns": "arrival_time_ns",
            "first_scheduled_time_ns": "first_scheduled_time_ns",
            "first_token_time_ns": "first_token_time_ns",
            "last_token_time_ns": "last_token_time_ns",
            "acceptance_rate": "acceptance_rate",
            "total_accepted_draft_tokens": "total_accepted_draft_tokens",
            "total_draft_tokens": "total_draft_tokens",
        },
    ),
    ("postprocessing", {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}, {"OUTPUT": "text_output"}),
)


@dataclass(frozen=True, kw_only=True)
class RepoOptions:
    """What the repository serves and how. Paths are as the *server* sees them (see ``server_root``)."""

    flavor: Literal["engine", "pytorch"]
    output: Path
    #: HF model dir (tokenizer files) — or, for the pytorch flavor, a hub id the server downloads.
    model: str
    tokenizer_dir: str | None = None
    engine_dir: str | None = None
    max_batch_size: int = 64
    kv_cache_free_gpu_mem_fraction: float = 0.85
    enable_kv_cache_reuse: bool = True
    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = "guaranteed_no_evict"
    max_queue_delay_microseconds: int = 0
    instance_count: int = 1
    #: ``tensorrtllm`` (C++, reads the tokenizer-info file) or ``python`` for the engine flavor.
    triton_backend: Literal["tensorrtllm", "python"] = "tensorrtllm"
    #: LLM-API arguments for the pytorch flavor (``BuildPlan.llm_api_options``).
    llm_api_options: Mapping[str, Any] = field(default_factory=dict)
    #: ``all_models/inflight_batcher_llm`` of the pinned TensorRT-LLM release (engine flavor).
    model_code_from: Path | None = None
    #: Where ``output`` is mounted on the Triton server; defaults to ``output`` itself.
    server_root: str | None = None

    def server_path(self, relative: str) -> str:
        root = self.server_root or str(self.output.resolve())
        return f"{root.rstrip('/')}/{relative}"


@dataclass(frozen=True, kw_only=True)
class RepoResult:
    root: Path
    entry_model: str
    models: tuple[str, ...]
    tokenizer_info_path: Path
    files: dict[str, str]
    notes: tuple[str, ...] = ()


_DTYPES = {name.removeprefix("TYPE_"): value for name, value in mc.DataType.items()}
_PLACEHOLDER_FILL = {
    "triton_max_batch_size": "8",
    "decoupled_mode": "true",
    "logits_datatype": "TYPE_FP32",
    "encoder_input_features_data_type": "TYPE_FP16",
    "prompt_embedding_table_data_type": "TYPE_FP16",
    "triton_backend": "tensorrtllm",
}


def _interface_from_template(path: Path) -> dict[str, tuple[TensorRow, ...]]:
    """Read a release's config template for its tensors only (its parameters are ours to set)."""
    text = re.sub(r"\$\{(\w+)\}", lambda m: _PLACEHOLDER_FILL.get(m.group(1), "1"), path.read_text())
    config = text_format.Parse(text, mc.ModelConfig())

    def rows(tensors: Any) -> tuple[TensorRow, ...]:
        out: dict[str, TensorRow] = {}
        for t in tensors:
            flags = ("o" if getattr(t, "optional", False) else "") + ("r" if t.HasField("reshape") else "")
            out.setdefault(t.name, (t.name, mc.DataType.Name(t.data_type).removeprefix("TYPE_"), tuple(t.dims), flags))
        return tuple(out.values())

    return {"input": rows(config.input), "output": rows(config.output)}


def _add_tensors(config: mc.ModelConfig, interface: Mapping[str, tuple[TensorRow, ...]]) -> None:
    for name, dtype, dims, flags in interface["input"]:
        tensor = config.input.add(name=name, data_type=_DTYPES[dtype], dims=list(dims), optional="o" in flags)
        if "r" in flags:
            tensor.reshape.SetInParent()
    for name, dtype, dims, _flags in interface["output"]:
        config.output.add(name=name, data_type=_DTYPES[dtype], dims=list(dims))


def _set_params(config: mc.ModelConfig, params: Mapping[str, Any]) -> None:
    for key, value in params.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        # Triton splits some list-valued parameters on commas; escape them as the backend expects.
        config.parameters[key].string_value = text.replace(",", "\\,") if key in {"gpu_device_ids"} else text


def _cpu_instances(config: mc.ModelConfig, count: int) -> None:
    config.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)


def _engine_configs(opts: RepoOptions, interfaces: Mapping[str, Mapping[str, tuple[TensorRow, ...]]], tokenizer_info: str) -> dict[str, mc.ModelConfig]:
    if not opts.engine_dir:
        raise ValueError("the engine flavor needs engine_dir")
    tokenizer_dir = opts.tokenizer_dir or opts.model
    n = opts.max_batch_size
    configs: dict[str, mc.ModelConfig] = {}

    pre = mc.ModelConfig(name="preprocessing", backend="python", max_batch_size=n)
    pre.dynamic_batching.SetInParent()
    _add_tensors(pre, interfaces["preprocessing"])
    _cpu_instances(pre, opts.instance_count)
    # The decider sends a prompt already rendered with the chat template, special tokens included.
    _set_params(pre, {"tokenizer_dir": tokenizer_dir, "add_special_tokens": False})
    configs["preprocessing"] = pre

    post = mc.ModelConfig(name="postprocessing", backend="python", max_batch_size=n)
    post.dynamic_batching.SetInParent()
    _add_tensors(post, interfaces["postprocessing"])
    _cpu_instances(post, opts.instance_count)
    _set_params(post, {"tokenizer_dir": tokenizer_dir, "skip_special_tokens": True})
    configs["postprocessing"] = post

    llm = mc.ModelConfig(name="tensorrt_llm", backend=opts.triton_backend, max_batch_size=n)
    llm.model_transaction_policy.decoupled = True
    llm.dynamic_batching.preferred_batch_size.append(n)
    llm.dynamic_batching.max_queue_delay_microseconds = opts.max_queue_delay_microseconds
    _add_tensors(llm, interfaces["tensorrt_llm"])
    _cpu_instances(llm, 1)
    llm_params: dict[str, Any] = {
        "max_beam_width": 1,
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": opts.engine_dir,
        "batch_scheduler_policy": opts.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": opts.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": opts.enable_kv_cache_reuse,
        "enable_chunked_context": True,
        "exclude_input_in_output": True,
        "normalize_log_probs": True,
        "cancellation_check_period_ms": 100,
        "stats_check_period_ms": 100,
        "iter_stats_max_iterations": 1000,
        "request_stats_max_iterations": 0,
        "executor_worker_path": _EXECUTOR_WORKER,
        "guided_decoding_backend": GUIDED_DECODING_BACKEND,
        "xgrammar_tokenizer_info_path": tokenizer_info,
        "tokenizer_dir": tokenizer_dir,
    }
    _set_params(llm, llm_params)
    configs["tensorrt_llm"] = llm

    bls = mc.ModelConfig(name="tensorrt_llm_bls", backend="python", max_batch_size=n)
    bls.model_transaction_policy.decoupled = True
    _add_tensors(bls, interfaces["tensorrt_llm_bls"])
    _cpu_instances(bls, opts.instance_count)
    _set_params(
        bls,
        {
            "accumulate_tokens": False,
            "tensorrt_llm_model_name": "tensorrt_llm",
            "tensorrt_llm_draft_model_name": "",
            "multimodal_encoders_name": "",
        },
    )
    configs["tensorrt_llm_bls"] = bls

    ens = mc.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=n)
    _add_tensors(ens, interfaces["ensemble"])
    ens_inputs = {row[0] for row in interfaces["ensemble"]["input"]}
    ens_outputs = {row[0] for row in interfaces["ensemble"]["output"]}
    for model_name, input_map, output_map in _ENSEMBLE_STEPS:
        step_inputs = {row[0] for row in interfaces[model_name]["input"]}
        step_outputs = {row[0] for row in interfaces[model_name]["output"]}
        step = ens.ensemble_scheduling.step.add(model_name=model_name, model_version=-1)
        for key, value in input_map.items():
            if key in step_inputs and (value.startswith("_") or value in ens_inputs):
                step.input_map[key] = value
        for key, value in output_map.items():
            if key in step_outputs and (value.startswith("_") or value in ens_outputs):
                step.output_map[key] = value
    configs["ensemble"] = ens
    return configs


def _llmapi_config(opts: RepoOptions, tokenizer_info: str) -> mc.ModelConfig:
    config = mc.ModelConfig(name=LLMAPI_MODEL, backend="python", max_batch_size=opts.max_batch_size)
    config.model_transaction_policy.decoupled = True
    for spec in CLIENT_INPUTS:
        required = spec.name in {"text_input", "max_tokens"}
        config.input.add(name=spec.name, data_type=spec.data_type, dims=list(spec.dims), optional=not required)
    for spec in CLIENT_OUTPUTS:
        config.output.add(name=spec.name, data_type=spec.data_type, dims=list(spec.dims))
    config.output.add(name="finish_reason", data_type=mc.TYPE_STRING, dims=[-1])
    _cpu_instances(config, 1)
    _set_params(
        config,
        {
            "guided_decoding_backend": GUIDED_DECODING_BACKEND,
            "llm_api_options": "llm_api_options.yaml",
            "model": opts.model,
            "tokenizer_dir": opts.tokenizer_dir or opts.model,
            "xgrammar_tokenizer_info_path": tokenizer_info,
        },
    )
    return config


def build_configs(opts: RepoOptions) -> dict[str, mc.ModelConfig]:
    """The repository's model configs, without writing anything."""
    if opts.flavor == "engine":
        interfaces: dict[str, Mapping[str, tuple[TensorRow, ...]]] = dict(INTERFACES)
        if opts.model_code_from is not None:
            for name in interfaces:
                template = opts.model_code_from / name / "config.pbtxt"
                if template.is_file():
                    interfaces[name] = _interface_from_template(template)
        return _engine_configs(opts, interfaces, opts.server_path(f"tensorrt_llm/{TOKENIZER_INFO_NAME}"))
    if opts.flavor == "pytorch":
        return {LLMAPI_MODEL: _llmapi_config(opts, opts.server_path(f"{LLMAPI_MODEL}/{TOKENIZER_INFO_NAME}"))}
    raise ValueError(f"unknown flavor {opts.flavor!r}")


def _llmapi_model_source() -> str:
    return (Path(__file__).with_name("llmapi_model.py")).read_text()


def write_triton_repo(opts: RepoOptions, tokenizer: Any, *, stop_token_ids: list[int] | None = None) -> RepoResult:
    """Write the repository to ``opts.output`` and check it; returns what was written.

    ``tokenizer`` is the model's HF fast tokenizer (the tokenizer-info file is generated from it).
    """
    configs = build_configs(opts)
    root = opts.output
    root.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    for name, config in configs.items():
        model_dir = root / name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    if opts.flavor == "engine":
        entry = ENGINE_ENTRY_MODEL
        info_dir = root / "tensorrt_llm"
        code_models = _CODE_MODELS + (("tensorrt_llm",) if opts.triton_backend == "python" else ())
        if opts.model_code_from is not None:
            for name in code_models:
                source = opts.model_code_from / name / "1"
                if not source.is_dir():
                    raise FileNotFoundError(f"{source} does not exist: model_code_from must be all_models/inflight_batcher_llm")
                shutil.copytree(source, root / name / "1", dirs_exist_ok=True)
        else:
            notes.append(
                "model code not copied: pass the pinned release's all_models/inflight_batcher_llm as model_code_from "
                f"to fill {', '.join(f'{m}/1' for m in code_models)}"
            )
        # Triton needs a version directory for an ensemble even though it has no files.
        (root / "ensemble" / "1").mkdir(parents=True, exist_ok=True)
    else:
        entry = LLMAPI_MODEL
        info_dir = root / LLMAPI_MODEL
        (root / LLMAPI_MODEL / "1" / "model.py").write_text(_llmapi_model_source())
        (root / LLMAPI_MODEL / "llm_api_options.yaml").write_text(
            yaml.safe_dump({"model": opts.model, "backend": "pytorch", **dict(opts.llm_api_options)}, sort_keys=True)
        )
    info_path = write_tokenizer_info(tokenizer, info_dir, stop_token_ids=stop_token_ids)

    # Read back what is on disk: it must parse and take exactly what the client sends, guided.
    require_servable(load_repository(root), entry)
    files = hash_tree(root, exclude=(REPO_MANIFEST_NAME,))
    (root / REPO_MANIFEST_NAME).write_text(
        json.dumps(
            {
                "flavor": opts.flavor,
                "entry_model": entry,
                "model": opts.model,
                "engine_dir": opts.engine_dir,
                "model_code_from": str(opts.model_code_from) if opts.model_code_from else None,
                "files": files,
                "notes": notes,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return RepoResult(
        root=root, entry_model=entry, models=tuple(configs), tokenizer_info_path=info_path, files=files, notes=tuple(notes)
    )
