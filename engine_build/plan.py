"""Plan a build: given a model, a GPU and a TensorRT-LLM version, the exact steps and a build key.

Two backends:

- ``engine`` (TensorRT-LLM 0.19 up to 1.0.x, legacy): ``convert_checkpoint.py`` of the model's
  family (or ``quantize.py`` for FP8, calibrated on a local dataset) → ``trtllm-build`` with
  paged KV cache and paged context FMHA (needed for KV-cache reuse). The engine runs only on the
  planned SM and TRT-LLM version. 0.19 is the floor: xgrammar reached the executor in 0.16,
  but the Triton backend takes guided-decoding inputs and parameters only from
  tensorrtllm_backend v0.19.0 (its v0.18.2 ``tensorrt_llm/config.pbtxt`` has neither).
- ``pytorch`` (TensorRT-LLM ≥ 1.0, the default there): no compile step; the plan is an LLM-API
  options file (``extra_llm_api_options`` for ``trtllm-serve``, the LLM arguments of the Triton
  LLM-API model) with guided decoding on and the overlap scheduler off: the PyTorch executor
  refuses guided decoding with it (TensorRT-LLM ``tensorrt_llm/_torch/pyexecutor/_util.py``,
  ``create_py_executor_instance``: ``if not pytorch_backend_config.disable_overlap_scheduler:
  raise ValueError("Guided decoding is not supported with overlap scheduler.")``), and 1.0.0's
  behaviour has not been confirmed on a GPU yet.

Both backends are planned only inside the window toolrail has checked, ``[floor, CHECKED_MAX_VERSION)``:
engines are tied to their exact TensorRT-LLM version and the Triton templates, the LLM-API
arguments and the image pin (``docker/Dockerfile.triton``) move with each release. The engine
build ends with the xgrammar tokenizer-info file (the C++ backend reads it; the LLM API builds
its own, so the pytorch build writes none). Every plan with a local model sizes its GPU and its
Triton task (:mod:`engine_build.sizing`) and is refused when they cannot fit. Planning runs nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from engine_build.errors import (
    PlanError,
    UnknownModelFamilyError,
    UnsupportedVersionError,
)
from engine_build.gpus import GPU, resolve_gpu
from engine_build.manifest import FileHashCache, build_key, model_fingerprint
from engine_build.sizing import TaskSizing, host_share_mib, read_model_shape, size_task, weight_files

__all__ = [
    "ALL_MODELS_MOVED_VERSION",
    "BACKENDS",
    "CHECKED_MAX_VERSION",
    "CONTRIB_FAMILIES",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_INPUT_LEN",
    "DEFAULT_MAX_NUM_TOKENS",
    "DEFAULT_MAX_SEQ_LEN",
    "ENGINE_MIN_VERSION",
    "EXAMPLES_MOVED_VERSION",
    "FAMILIES",
    "PYTORCH_MIN_VERSION",
    "BuildOptions",
    "BuildPlan",
    "Step",
    "all_models_source",
    "detect_model_type",
    "plan_build",
]

BACKENDS = ("auto", "engine", "pytorch")
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_MAX_INPUT_LEN = 4096
DEFAULT_MAX_SEQ_LEN = 5120
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_KV_CACHE_FREE_GPU_MEM_FRACTION = 0.85

#: Guided decoding (xgrammar) through the Triton backend: tensorrtllm_backend v0.19.0.
ENGINE_MIN_VERSION = Version("0.19.0")
#: ``examples/<family>/`` moved to ``examples/models/core/<family>/`` (``models/contrib/`` for some).
EXAMPLES_MOVED_VERSION = Version("0.18.0")
#: ``all_models/inflight_batcher_llm`` moved from tensorrtllm_backend into TensorRT-LLM's ``triton_backend/``.
ALL_MODELS_MOVED_VERSION = Version("0.20.0")
#: The PyTorch backend became the default (and the LLM-API Triton model the way to serve it).
PYTORCH_MIN_VERSION = Version("1.0.0")
#: First release toolrail has not checked (exclusive upper bound of both backends): 1.0.x is what
#: the pinned image (Triton 25.10) carries; widen after scripts/gpu_check.sh passes on the next one.
CHECKED_MAX_VERSION = Version("1.1.0")

#: HF ``model_type`` → the examples directory whose ``convert_checkpoint.py`` converts it.
FAMILIES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen",
    "qwen": "qwen",
    "qwen2_moe": "qwen",
    "gemma": "gemma",
    "gemma2": "gemma",
    "phi3": "phi",
    "phi": "phi",
    "gpt2": "gpt",
    "falcon": "falcon",
}

#: Families whose example moved to ``examples/models/contrib/`` rather than ``models/core/``.
CONTRIB_FAMILIES = frozenset({"falcon"})

#: Hub ids without a local config.json: guess the family from the name.
_NAME_HINTS = (
    (re.compile(r"qwen2|qwen-?2", re.I), "qwen2"),
    (re.compile(r"smollm|llama|tinyllama", re.I), "llama"),
    (re.compile(r"mistral", re.I), "mistral"),
    (re.compile(r"gemma", re.I), "gemma"),
    (re.compile(r"phi-?3", re.I), "phi3"),
)

Dtype = Literal["auto", "bfloat16", "float16"]


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Everything that decides what gets built. Keyword-only; defaults fit an 8B model on one H100."""

    model: str
    gpu: str
    trtllm_version: str
    backend: str = "auto"
    revision: str | None = None
    model_type: str | None = None
    tp: int = 1
    pp: int = 1
    dtype: Dtype = "bfloat16"
    quantization: Literal["none", "fp8"] = "none"
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_input_len: int = DEFAULT_MAX_INPUT_LEN
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS
    kv_cache_free_gpu_mem_fraction: float = DEFAULT_KV_CACHE_FREE_GPU_MEM_FRACTION
    workers: int = 1
    #: Local calibration data for FP8 (``quantize.py --calib_dataset``); its default is a hub dataset.
    calib_dataset: Path | None = None
    output_root: Path = Path("engines")
    trtllm_src: Path = Path("TensorRT-LLM")
    python: str = "python3"
    #: Host memory the Triton task may use (MiB); default: its share of the GPU's catalog instance.
    task_memory_limit_mib: int | None = None

    def key_options(self) -> dict[str, Any]:
        """The options that change the artefact (paths and tooling don't)."""
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "max_batch_size": self.max_batch_size,
            "max_input_len": self.max_input_len,
            "max_seq_len": self.max_seq_len,
            "max_num_tokens": self.max_num_tokens,
            "kv_cache_free_gpu_mem_fraction": self.kv_cache_free_gpu_mem_fraction,
        }


@dataclass(frozen=True, kw_only=True)
class Step:
    """One build step: a subprocess (``argv``) or an in-process action (``action``)."""

    name: str
    description: str
    argv: tuple[str, ...] = ()
    action: str | None = None
    #: Directory or file the step produces (relative steps are skipped when it already exists).
    output: Path | None = None

    @property
    def is_subprocess(self) -> bool:
        return bool(self.argv)

    def shell(self) -> str:
        """The step as one copy-pasteable shell line."""
        import shlex

        if self.argv:
            return shlex.join(self.argv)
        return f"# in-process: {self.action} -> {self.output}"


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    """The resolved build: where it goes, what runs, and its key."""

    key: str
    options: BuildOptions
    gpu: GPU
    backend: Literal["engine", "pytorch"]
    model_type: str
    model_fingerprint: str
    out_dir: Path
    steps: tuple[Step, ...]
    #: LLM-API arguments (pytorch backend; also recorded for engine builds).
    llm_api_options: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: GPU and task memory (None when the model's config.json is not local).
    sizing: TaskSizing | None = None

    @property
    def engine_dir(self) -> Path:
        return self.out_dir / "engine"

    @property
    def checkpoint_dir(self) -> Path:
        return self.out_dir / "checkpoint"

    @property
    def tokenizer_info_path(self) -> Path:
        return self.out_dir / "tokenizer_info" / "xgrammar_tokenizer_info.json"

    @property
    def llm_api_options_path(self) -> Path:
        return self.out_dir / "llm_api_options.yaml"

    def commands(self) -> list[list[str]]:
        return [list(step.argv) for step in self.steps if step.argv]

    def to_dict(self) -> dict[str, Any]:
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.options).items()}
        return {
            "key": self.key,
            "backend": self.backend,
            "gpu": {"name": self.gpu.name, "sm": self.gpu.sm, "arch": self.gpu.arch},
            "trtllm_version": self.options.trtllm_version,
            "model_type": self.model_type,
            "model_fingerprint": self.model_fingerprint,
            "out_dir": str(self.out_dir),
            "options": options,
            "steps": [
                {"name": s.name, "description": s.description, "argv": list(s.argv), "action": s.action,
                 "output": str(s.output) if s.output else None}
                for s in self.steps
            ],
            "llm_api_options": self.llm_api_options,
            "notes": list(self.notes),
            "sizing": self.sizing.to_dict() if self.sizing else None,
        }


def parse_version(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion as exc:
        raise UnsupportedVersionError(text, "not a version number") from exc


def detect_model_type(model: str, explicit: str | None = None) -> str:
    """The HF ``model_type``: given, read from ``config.json``, or guessed from a hub id."""
    if explicit:
        return explicit
    config = Path(model) / "config.json"
    if config.is_file():
        model_type = json.loads(config.read_text()).get("model_type")
        if model_type:
            return str(model_type)
    for pattern, model_type in _NAME_HINTS:
        if pattern.search(model):
            return model_type
    raise PlanError(f"cannot tell the model family of {model!r}: give a local dir with config.json or --model-type")


def _choose_backend(requested: str, version: Version) -> Literal["engine", "pytorch"]:
    if requested not in BACKENDS:
        raise PlanError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "auto":
        requested = "pytorch" if version >= PYTORCH_MIN_VERSION else "engine"
    if Version(version.base_version) >= CHECKED_MAX_VERSION:  # 1.1.0rc0 is a 1.1 release too
        raise UnsupportedVersionError(
            str(version),
            f"toolrail has checked TensorRT-LLM up to {CHECKED_MAX_VERSION} (exclusive): the Triton templates, "
            "LLM-API arguments and image pin of a newer release must be checked (scripts/gpu_check.sh) first",
        )
    if requested == "pytorch" and version < PYTORCH_MIN_VERSION:
        raise UnsupportedVersionError(str(version), f"the pytorch backend needs TensorRT-LLM >= {PYTORCH_MIN_VERSION}")
    if requested == "engine" and version < ENGINE_MIN_VERSION:
        raise UnsupportedVersionError(
            str(version),
            f"guided decoding through the Triton backend needs TensorRT-LLM >= {ENGINE_MIN_VERSION} "
            "(tensorrtllm_backend v0.19.0 added the guided-decoding inputs and parameters)",
        )
    return requested  # type: ignore[return-value]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(text.rstrip("/")).name or text).strip("-").lower()


def _convert_script(opts: BuildOptions, version: Version, family: str) -> Path:
    if version >= EXAMPLES_MOVED_VERSION:
        tier = "contrib" if family in CONTRIB_FAMILIES else "core"
        return opts.trtllm_src / "examples" / "models" / tier / family / "convert_checkpoint.py"
    return opts.trtllm_src / "examples" / family / "convert_checkpoint.py"


def all_models_source(version: Version | str) -> str:
    """Where the pinned release's Triton model templates and code live (``--model-code-from``)."""
    version = Version(str(version))
    if version >= ALL_MODELS_MOVED_VERSION:
        return f"TensorRT-LLM v{version}: triton_backend/all_models/inflight_batcher_llm"
    return f"tensorrtllm_backend v{version}: all_models/inflight_batcher_llm"


def _convert_argv(opts: BuildOptions, version: Version, family: str, dtype: str, checkpoint_dir: Path) -> tuple[str, ...]:
    script = str(_convert_script(opts, version, family))
    if family == "gemma":
        # Gemma's converter has its own flags (examples/models/core/gemma/convert_checkpoint.py,
        # parse_arguments): --ckpt-type, --model-dir, --output-model-dir, --world-size; tensor parallelism only.
        if opts.pp != 1:
            raise PlanError("gemma's convert_checkpoint.py supports tensor parallelism only (pp must be 1)")
        return (
            opts.python, script,
            "--ckpt-type", "hf",
            "--model-dir", opts.model,
            "--output-model-dir", str(checkpoint_dir),
            "--dtype", dtype,
            "--world-size", str(opts.tp),
        )
    return (
        opts.python, script,
        "--model_dir", opts.model,
        "--output_dir", str(checkpoint_dir),
        "--dtype", dtype,
        "--tp_size", str(opts.tp),
        "--pp_size", str(opts.pp),
    )


def _engine_steps(opts: BuildOptions, version: Version, model_type: str, out_dir: Path) -> tuple[list[Step], list[str]]:
    notes: list[str] = []
    family = FAMILIES.get(model_type)
    if family is None:
        raise UnknownModelFamilyError(model_type, FAMILIES)
    if not Path(opts.model).is_dir():
        raise PlanError(f"the engine backend converts a local checkpoint; {opts.model!r} is not a directory")
    checkpoint_dir = out_dir / "checkpoint"
    engine_dir = out_dir / "engine"
    dtype = "bfloat16" if opts.dtype == "auto" else opts.dtype
    steps: list[Step] = []
    if opts.quantization == "fp8":
        # examples/quantization/quantize.py: --calib_dataset defaults to 'cnn_dailymail', "the huggingface
        # dataset name or the local directory of the dataset" — only the latter works on a host without a hub.
        if opts.calib_dataset is None or not Path(opts.calib_dataset).is_dir():
            raise PlanError(
                "FP8 calibration needs a local dataset directory (calib_dataset / --calib-dataset): quantize.py's "
                "default downloads one from a hub, which a build host may not reach"
            )
        steps.append(
            Step(
                name="quantize",
                description="FP8 weights and KV cache via ModelOpt (calibration on the GPU)",
                argv=(
                    opts.python, str(opts.trtllm_src / "examples" / "quantization" / "quantize.py"),
                    "--model_dir", opts.model,
                    "--dtype", dtype,
                    "--qformat", "fp8",
                    "--kv_cache_dtype", "fp8",
                    "--calib_size", "512",
                    "--calib_dataset", str(opts.calib_dataset),
                    "--tp_size", str(opts.tp),
                    "--pp_size", str(opts.pp),
                    "--output_dir", str(checkpoint_dir),
                ),
                output=checkpoint_dir,
            )
        )
    else:
        steps.append(
            Step(
                name="convert",
                description=f"HF checkpoint → TensorRT-LLM checkpoint ({family} recipe)",
                argv=_convert_argv(opts, version, family, dtype, checkpoint_dir),
                output=checkpoint_dir,
            )
        )
    build_argv = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(engine_dir),
        "--gemm_plugin", "auto" if opts.quantization == "fp8" else dtype,
        "--max_batch_size", str(opts.max_batch_size),
        "--max_input_len", str(opts.max_input_len),
        "--max_seq_len", str(opts.max_seq_len),
        "--max_num_tokens", str(opts.max_num_tokens),
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", "enable",
        "--remove_input_padding", "enable",
        "--workers", str(opts.workers),
    ]
    if opts.quantization == "fp8":
        build_argv += ["--use_fp8_context_fmha", "enable"]
    steps.append(
        Step(
            name="trtllm-build",
            description="compile the TensorRT engine (paged KV cache, paged context FMHA for KV reuse)",
            argv=tuple(build_argv),
            output=engine_dir,
        )
    )
    notes.append(f"serve with the release's Triton models: --model-code-from <{all_models_source(version)}>")
    if version >= PYTORCH_MIN_VERSION:
        notes.append(
            f"TensorRT-LLM {version} defaults to the PyTorch backend; the trtllm-build path is legacy "
            "and removed in later releases"
        )
    return steps, notes


def _llm_api_options(opts: BuildOptions, *, backend: str) -> dict[str, Any]:
    """LLM-API arguments (``extra_llm_api_options`` / the LLM-API Triton model's LLM kwargs)."""
    options: dict[str, Any] = {
        "tensor_parallel_size": opts.tp,
        "pipeline_parallel_size": opts.pp,
        "dtype": opts.dtype,
        "max_batch_size": opts.max_batch_size,
        "max_num_tokens": opts.max_num_tokens,
        "max_seq_len": opts.max_seq_len,
        "guided_decoding_backend": "xgrammar",
        "enable_chunked_prefill": True,
        "kv_cache_config": {
            "free_gpu_memory_fraction": opts.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": True,
        },
    }
    if backend == "pytorch":
        # Guided decoding with the overlap scheduler is refused by the PyTorch executor (module docstring).
        options["disable_overlap_scheduler"] = True
        options["cuda_graph_config"] = {"enable_padding": True, "max_batch_size": opts.max_batch_size}
        if opts.quantization == "fp8":
            options["kv_cache_config"]["dtype"] = "fp8"
    return options


def plan_build(opts: BuildOptions, *, hash_cache: FileHashCache | None = None) -> BuildPlan:
    """Resolve ``opts`` into a :class:`BuildPlan`. Runs nothing; reads the model files to hash them."""
    gpu = resolve_gpu(opts.gpu)
    version = parse_version(opts.trtllm_version)
    backend = _choose_backend(opts.backend, version)
    if opts.tp < 1 or opts.pp < 1:
        raise PlanError("tp and pp must be >= 1")
    if opts.max_seq_len < opts.max_input_len:
        raise PlanError(f"max_seq_len ({opts.max_seq_len}) must be >= max_input_len ({opts.max_input_len})")
    if opts.max_num_tokens < 1 or opts.max_batch_size < 1:
        raise PlanError("max_num_tokens and max_batch_size must be >= 1")
    if opts.quantization == "fp8" and not gpu.fp8:
        raise PlanError(f"FP8 needs SM >= 89 (Ada/Hopper/Blackwell); {gpu.name} is SM {gpu.sm}")
    model_type = detect_model_type(opts.model, opts.model_type)
    fingerprint = model_fingerprint(opts.model, revision=opts.revision, cache=hash_cache)
    key = build_key(
        model_fingerprint=fingerprint,
        sm=gpu.sm,
        trtllm_version=str(version),
        backend=backend,
        options=opts.key_options(),
    )
    out_dir = opts.output_root / f"{_slug(opts.model)}-{gpu.name}-sm{gpu.sm}-trtllm{version}-{backend}-{key[:12]}"
    notes: list[str] = []
    steps: list[Step] = []
    if backend == "engine":
        steps, notes = _engine_steps(opts, version, model_type, out_dir)
        steps.append(
            Step(
                name="tokenizer-info",
                description="xgrammar tokenizer info for the C++ guided-decoding backend",
                action="tokenizer_info",
                output=out_dir / "tokenizer_info" / "xgrammar_tokenizer_info.json",
            )
        )
    else:
        if opts.quantization == "fp8":
            notes.append(
                "pytorch backend + fp8: serve an FP8 (ModelOpt) checkpoint; the KV cache is set to fp8 here"
            )
        steps.append(
            Step(
                name="llm-api-options",
                description="write the LLM-API options (guided_decoding_backend: xgrammar)",
                action="llm_api_options",
                output=out_dir / "llm_api_options.yaml",
            )
        )
    sizing = plan_sizing(opts, backend=backend, gpu=gpu)
    if sizing is None:
        notes.append("not sized: the model's config.json is not local (publish sizes it from the files it uploads)")
    else:
        notes.append(sizing.summary())
    return BuildPlan(
        key=key,
        options=opts,
        gpu=gpu,
        backend=backend,
        model_type=model_type,
        model_fingerprint=fingerprint,
        out_dir=out_dir,
        steps=tuple(steps),
        llm_api_options=_llm_api_options(opts, backend=backend),
        notes=tuple(notes),
        sizing=sizing,
    )


def plan_sizing(opts: BuildOptions, *, backend: str, gpu: GPU, model_dir: Path | None = None,
                weight_bytes: int | None = None, largest_file_bytes: int | None = None,
                bls_instances: int | None = None) -> TaskSizing | None:
    """Size the build's GPU and Triton task; None without a local ``config.json``.

    Without ``weight_bytes`` the served weights are estimated: the checkpoint's safetensors
    (parameters × 1 byte for FP8, 2 otherwise), or the parameter count from the config.
    """
    model_dir = model_dir or Path(opts.model)
    shape = read_model_shape(model_dir) if model_dir.is_dir() else None
    if shape is None:
        return None
    served = 1 if opts.quantization == "fp8" else 2
    if weight_bytes is None:
        files = weight_files(model_dir)
        checkpoint = sum(f.stat().st_size for f in files)
        params = checkpoint // shape.checkpoint_dtype_bytes if files else shape.params
        weight_bytes = params * served
        largest_file_bytes = max((f.stat().st_size for f in files), default=weight_bytes)
    limit = opts.task_memory_limit_mib or host_share_mib(gpu.name, opts.tp * opts.pp)
    return size_task(
        backend=backend, gpu=gpu, shape=shape, weight_bytes=weight_bytes,
        largest_file_bytes=largest_file_bytes or weight_bytes, tp=opts.tp * opts.pp,
        max_batch_size=opts.max_batch_size, max_seq_len=opts.max_seq_len, max_num_tokens=opts.max_num_tokens,
        kv_cache_free_gpu_mem_fraction=opts.kv_cache_free_gpu_mem_fraction,
        kv_dtype_bytes=1 if opts.quantization == "fp8" else 2, host_limit_mib=limit, bls_instances=bls_instances,
    )
