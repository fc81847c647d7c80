"""Write a complete Triton model repository for a build, guided decoding on, every parameter filled.

Two flavors:

- ``engine``: the inflight-batching layout of the pinned release (``preprocessing`` →
  ``tensorrt_llm`` → ``postprocessing``, their ``ensemble``, and ``tensorrt_llm_bls``, the
  model the decider talks to). The configs are the release's own templates
  (``model_code_from`` = its ``all_models/inflight_batcher_llm``) with every ``${placeholder}``
  filled (:func:`template_values`): inputs, flags and parameters are the release's, not a copy
  of them, so a release that renames an input (``random_seed`` → ``seed``) or adds a parameter
  its code reads without a default (``multimodal_model_path`` from v0.19, ``visual_model_path``
  before) gets it. A release without guided decoding in its Triton backend (before
  tensorrtllm_backend v0.19.0) is refused (:func:`release_problems`). The Python model code
  of preprocessing/postprocessing/BLS is copied from the same directory.
- ``pytorch``: one Python model, ``llmapi``, serving the LLM API (PyTorch backend) with
  toolrail's own model code (``engine_build/llmapi_model.py``): the same tensors as the BLS
  model, guided decoding through ``GuidedDecodingParams``.

:func:`write_triton_repo` parses what it wrote back and checks it against the client's wire
contract (``decider/triton_wire.py``) before returning.
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

from decider.tool_formats import resolve_tool_format
from engine_build.config_check import (
    CLIENT_INPUTS,
    CLIENT_OUTPUTS,
    GUIDED_DECODING_BACKEND,
    load_repository,
    require_servable,
)
from engine_build.errors import ConfigCheckError
from engine_build.manifest import hash_tree
from engine_build.tokenizer_info import TOKENIZER_INFO_NAME, write_tokenizer_info

__all__ = [
    "ENGINE_ENTRY_MODEL",
    "LLMAPI_MODEL",
    "REPO_MANIFEST_NAME",
    "RepoOptions",
    "RepoResult",
    "build_configs",
    "fill_template",
    "release_problems",
    "template_values",
    "write_triton_repo",
]

ENGINE_ENTRY_MODEL = "tensorrt_llm_bls"
LLMAPI_MODEL = "llmapi"
REPO_MANIFEST_NAME = "toolrail_repo_manifest.json"
_CODE_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")
_ENGINE_MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", ENGINE_ENTRY_MODEL)


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
    #: BLS instances (engine flavour): the plan's bound (``sizing.bls_instances``); None = one per batch slot.
    bls_instance_count: int | None = None
    #: ``tensorrtllm`` (C++, reads the tokenizer-info file) or ``python`` for the engine flavor.
    triton_backend: Literal["tensorrtllm", "python"] = "tensorrtllm"
    #: LLM-API arguments for the pytorch flavor (``BuildPlan.llm_api_options``).
    llm_api_options: Mapping[str, Any] = field(default_factory=dict)
    #: ``all_models/inflight_batcher_llm`` of the pinned TensorRT-LLM release (engine flavor).
    model_code_from: Path | None = None
    #: Copy the release's Python model code next to the configs (off: configs only).
    copy_model_code: bool = True
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
    #: The xgrammar tokenizer-info file (engine flavour; the LLM API needs none).
    tokenizer_info_path: Path | None
    files: dict[str, str]
    notes: tuple[str, ...] = ()


_DTYPES = {name.removeprefix("TYPE_"): value for name, value in mc.DataType.items()}
_TEMPLATE_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")


def _set_params(config: mc.ModelConfig, params: Mapping[str, Any]) -> None:
    for key, value in params.items():
        config.parameters[key].string_value = _text(value)


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _cpu_instances(config: mc.ModelConfig, count: int) -> None:
    config.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)


def template_values(opts: RepoOptions, tokenizer_info: str) -> dict[str, str]:
    """What each ``${placeholder}`` of the release's templates becomes.

    A placeholder not named here is filled with the empty string, the value the release's
    own code reads as "not set": the Python models compare with ``""`` and ``"${name}"``
    (``preprocessing/1/model.py`` lines 86-87, ``tensorrt_llm_bls/1/model.py``
    ``get_valid_param_value``, v0.19.0) and the C++ backend parses each optional parameter
    inside ``try``/``catch`` and falls back to its default
    (``inflight_batcher_llm/src/model_instance_state.cc``, ``getExecutorConfigFromParams``).
    """
    if not opts.engine_dir:
        raise ValueError("the engine flavor needs engine_dir")
    values: dict[str, Any] = {
        "triton_max_batch_size": opts.max_batch_size,
        "decoupled_mode": True,
        "max_queue_delay_microseconds": opts.max_queue_delay_microseconds,
        # Triton's ModelQueuePolicy: 0 = no limit.
        "max_queue_size": 0,
        "preprocessing_instance_count": opts.instance_count,
        "postprocessing_instance_count": opts.instance_count,
        # The BLS's execute() is synchronous: one instance serves one request at a time, so
        # run as many as the engine batches (docs/model_config.md line 210, v0.19.0) - or as
        # many as the task's host memory holds (each imports torch; engine_build/sizing.py).
        "bls_instance_count": min(opts.bls_instance_count or opts.max_batch_size, opts.max_batch_size),
        "logits_datatype": "TYPE_FP32",
        "encoder_input_features_data_type": "TYPE_FP16",
        "prompt_embedding_table_data_type": "TYPE_FP16",
        "triton_backend": opts.triton_backend,
        "engine_dir": opts.engine_dir,
        "tokenizer_dir": opts.tokenizer_dir or opts.model,
        # The decider sends a prompt already rendered with the chat template, special tokens included.
        "add_special_tokens": False,
        "skip_special_tokens": True,
        # Decode all tokens so far at every step: a multi-byte character split across steps
        # would otherwise be decoded alone, as U+FFFD (docs/model_config.md line 219, v0.19.0).
        "accumulate_tokens": True,
        "tensorrt_llm_model_name": "tensorrt_llm",
        "batching_strategy": "inflight_fused_batching",
        "batch_scheduler_policy": opts.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": opts.kv_cache_free_gpu_mem_fraction,
        "enable_kv_cache_reuse": opts.enable_kv_cache_reuse,
        "enable_chunked_context": True,
        "exclude_input_in_output": True,
        "max_beam_width": 1,
        "normalize_log_probs": True,
        "cancellation_check_period_ms": 100,
        "stats_check_period_ms": 100,
        "iter_stats_max_iterations": 1000,
        "request_stats_max_iterations": 0,
        "guided_decoding_backend": GUIDED_DECODING_BACKEND,
        "xgrammar_tokenizer_info_path": tokenizer_info,
    }
    return {key: _text(value) for key, value in values.items()}


def fill_template(text: str, values: Mapping[str, str], *, model: str) -> mc.ModelConfig:
    """A release's ``config.pbtxt`` template with every placeholder filled, parsed.

    Everything else — inputs with all their flags (``optional``, ``reshape``,
    ``allow_ragged_batch``), outputs, batching and the parameters the release sets itself —
    stays as the release wrote it.
    """
    unknown = sorted(set(_TEMPLATE_PLACEHOLDER.findall(text)) - values.keys())
    filled = _TEMPLATE_PLACEHOLDER.sub(lambda m: values.get(m.group(1), ""), text)
    try:
        return text_format.Parse(filled, mc.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigCheckError(
            model, [f"the release's template does not parse once filled ({exc}); placeholders toolrail does not know: {unknown}"]
        ) from exc


def release_problems(templates: Mapping[str, mc.ModelConfig]) -> list[str]:
    """Why a release's model repository cannot serve the decider with guided decoding."""
    problems: list[str] = []
    missing = [name for name in _ENGINE_MODELS if name not in templates]
    if missing:
        problems.append(f"the release has no {', '.join(missing)} model")
        return problems
    llm = templates["tensorrt_llm"]
    for key in ("guided_decoding_backend", "xgrammar_tokenizer_info_path"):
        if key not in llm.parameters:
            problems.append(
                f"tensorrt_llm has no {key!r} parameter: guided decoding reached the Triton backend in "
                "tensorrtllm_backend v0.19.0"
            )
    for name in ("tensorrt_llm", ENGINE_ENTRY_MODEL):
        declared = {tensor.name for tensor in templates[name].input}
        for guide in ("guided_decoding_guide_type", "guided_decoding_guide"):
            if guide not in declared:
                problems.append(f"{name} does not take {guide!r}")
    return problems


def _engine_configs(opts: RepoOptions, tokenizer_info: str) -> dict[str, mc.ModelConfig]:
    if opts.model_code_from is None:
        raise ValueError(
            "the engine flavor is generated from the pinned release's own templates: pass model_code_from "
            "(all_models/inflight_batcher_llm of tensorrtllm_backend <= v0.19, TensorRT-LLM's triton_backend/ from v0.20)"
        )
    values = template_values(opts, tokenizer_info)
    configs: dict[str, mc.ModelConfig] = {}
    for name in _ENGINE_MODELS:
        path = opts.model_code_from / name / "config.pbtxt"
        if path.is_file():
            configs[name] = fill_template(path.read_text(), values, model=name)
    problems = release_problems(configs)
    if problems:
        raise ConfigCheckError(str(opts.model_code_from), problems)
    return configs


def _llmapi_config(opts: RepoOptions) -> mc.ModelConfig:
    config = mc.ModelConfig(name=LLMAPI_MODEL, backend="python", max_batch_size=opts.max_batch_size)
    config.model_transaction_policy.decoupled = True
    for spec in CLIENT_INPUTS:
        if spec.if_declared:
            continue  # the LLM-API model says why it stopped (finish_reason) instead
        required = spec.name in {"text_input", "max_tokens"}
        config.input.add(name=spec.name, data_type=spec.data_type, dims=list(spec.dims), optional=not required)
    for spec in CLIENT_OUTPUTS:
        config.output.add(name=spec.name, data_type=spec.data_type, dims=list(spec.dims))
    config.output.add(name="finish_reason", data_type=mc.TYPE_STRING, dims=[-1])
    _cpu_instances(config, 1)
    # Only what llmapi_model.py reads: the LLM API builds its grammar tokenizer info itself.
    _set_params(
        config,
        {"guided_decoding_backend": GUIDED_DECODING_BACKEND, "llm_api_options": "llm_api_options.yaml", "model": opts.model},
    )
    return config


def build_configs(opts: RepoOptions) -> dict[str, mc.ModelConfig]:
    """The repository's model configs, without writing anything."""
    if opts.flavor == "engine":
        return _engine_configs(opts, opts.server_path(f"tensorrt_llm/{TOKENIZER_INFO_NAME}"))
    if opts.flavor == "pytorch":
        return {LLMAPI_MODEL: _llmapi_config(opts)}
    raise ValueError(f"unknown flavor {opts.flavor!r}")


def executor_end_id(tokenizer: Any) -> int:
    """The end id the engine flavor's executor stops on: preprocessing's ``tokenizer_end_id``."""
    if not tokenizer.eos_token:
        raise ValueError("the tokenizer has no eos token: the executor would have no end_id")
    return tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]


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
        code_models = _CODE_MODELS + (("tensorrt_llm",) if opts.triton_backend == "python" else ())
        assert opts.model_code_from is not None  # build_configs refused without it
        if opts.copy_model_code:
            for name in code_models:
                source = opts.model_code_from / name / "1"
                if not source.is_dir():
                    raise FileNotFoundError(f"{source} does not exist: model_code_from must be all_models/inflight_batcher_llm")
                shutil.copytree(source, root / name / "1", dirs_exist_ok=True)
        else:
            notes.append(f"model code not copied (configs only): {', '.join(f'{m}/1' for m in code_models)} are empty")
        # The executor stops only on its end_id, which preprocessing takes from the tokenizer's
        # EOS (preprocessing/1/model.py lines 119-120 and 259, v0.19.0); a grammar that also accepted
        # another stop id would end in a token the executor decodes past.
        end_id = executor_end_id(tokenizer)
        if stop_token_ids is not None and set(stop_token_ids) != {end_id}:
            notes.append(f"stop ids {sorted(stop_token_ids)} narrowed to the executor's end_id {end_id}")
        stop_token_ids = [end_id]
        # Triton needs a version directory for an ensemble even though it has no files.
        (root / "ensemble" / "1").mkdir(parents=True, exist_ok=True)
        info_path: Path | None = write_tokenizer_info(tokenizer, root / "tensorrt_llm", stop_token_ids=stop_token_ids)
    else:
        entry = LLMAPI_MODEL
        info_path = None
        (root / LLMAPI_MODEL / "1" / "model.py").write_text(_llmapi_model_source())
        (root / LLMAPI_MODEL / "llm_api_options.yaml").write_text(
            yaml.safe_dump({"model": opts.model, "backend": "pytorch", **dict(opts.llm_api_options)}, sort_keys=True)
        )

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
                # The tool-call syntax the decider forces for this model (its chat template's family), sent as
                # guide type ebnf_grammar: no release's Triton backend takes a structural tag (docs/production.md).
                "tool_call_format": resolve_tool_format(tokenizer).name,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return RepoResult(
        root=root, entry_model=entry, models=tuple(configs), tokenizer_info_path=info_path, files=files, notes=tuple(notes)
    )
