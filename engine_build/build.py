"""Run a :class:`~engine_build.plan.BuildPlan`: preflight, steps as subprocesses with streamed logs, manifest.

A plan whose key already has an intact manifest in its output directory is a cache hit:
nothing runs. Subprocess output is streamed line by line to the console and to
``<out_dir>/logs/<step>.log``; a failing step raises :class:`BuildStepError` naming its log.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from engine_build.errors import BuildStepError, NoGPUError, PlanError, TensorRTLLMNotInstalledError
from engine_build.gpus import detect_gpus
from engine_build.manifest import FileHashCache, Manifest, find_cached, hash_tree
from engine_build.plan import BuildOptions, BuildPlan, Step, plan_build
from engine_build.tokenizer_info import stop_token_ids_for, write_tokenizer_info

__all__ = [
    "BuildResult",
    "LineSink",
    "StepRunner",
    "build",
    "load_matrix",
    "plan_matrix",
    "preflight",
    "subprocess_runner",
]

LineSink = Callable[[str], None]


class StepRunner(Protocol):
    """Runs one subprocess step, feeding each output line to ``sink``; returns the exit code."""

    def __call__(self, argv: Sequence[str], *, sink: LineSink, env: dict[str, str] | None = None) -> int: ...


def subprocess_runner(argv: Sequence[str], *, sink: LineSink, env: dict[str, str] | None = None) -> int:
    """Run ``argv``, streaming merged stdout/stderr line by line."""
    with subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sink(line.rstrip("\n"))
        return proc.wait()


@dataclass(kw_only=True)
class BuildResult:
    plan: BuildPlan
    manifest: Manifest
    cache_hit: bool
    skipped_steps: list[str] = field(default_factory=list)


def preflight(plan: BuildPlan, *, check_gpu: bool = True) -> None:
    """Refuse early, naming what is missing: ``tensorrt_llm``, ``trtllm-build``, the scripts, the GPU.

    ``tensorrt_llm`` must import in the interpreter that runs the example scripts
    (``options.python``), which need not be toolrail's own (in NVIDIA's image toolrail runs from
    its own virtualenv, beside the image's TensorRT-LLM and transformers 4.x).
    """
    if not _imports_tensorrt_llm(plan.options.python):
        raise TensorRTLLMNotInstalledError(
            f"the tensorrt_llm Python package (for {plan.options.python})",
            f"install TensorRT-LLM {plan.options.trtllm_version} (NVIDIA's wheel index or the NGC container)",
        )
    if plan.backend == "engine":
        if shutil.which("trtllm-build") is None:
            raise TensorRTLLMNotInstalledError("the trtllm-build command", "it ships with the tensorrt_llm wheel; is its bin dir on PATH?")
        for step in plan.steps:
            scripts = [arg for arg in step.argv if arg.endswith(".py")]
            for script in scripts:
                if not Path(script).is_file():
                    raise TensorRTLLMNotInstalledError(
                        f"{script}", f"pass --trtllm-src pointing at a TensorRT-LLM {plan.options.trtllm_version} checkout"
                    )
    if check_gpu:
        gpus = detect_gpus()
        if plan.backend == "engine" and not any(gpu.sm == plan.gpu.sm for gpu in gpus):
            seen = ", ".join(f"{gpu.name} (SM {gpu.sm})" for gpu in gpus)
            raise NoGPUError(
                f"a GPU with SM {plan.gpu.sm} ({plan.gpu.name})",
                f"this machine has {seen}; engines only run on the SM they were built on",
            )


def _imports_tensorrt_llm(python: str) -> bool:
    if Path(python).resolve() == Path(sys.executable).resolve():
        return importlib.util.find_spec("tensorrt_llm") is not None
    if shutil.which(python) is None:
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorrt_llm') is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=120, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _write_llm_api_options(plan: BuildPlan) -> None:
    plan.llm_api_options_path.parent.mkdir(parents=True, exist_ok=True)
    plan.llm_api_options_path.write_text(yaml.safe_dump(plan.llm_api_options, sort_keys=True))


def _write_tokenizer_info(plan: BuildPlan) -> None:
    from transformers import AutoTokenizer

    model_dir = Path(plan.options.model)
    tokenizer = AutoTokenizer.from_pretrained(plan.options.model, revision=plan.options.revision)
    stops = stop_token_ids_for(tokenizer, model_dir if model_dir.is_dir() else None)
    write_tokenizer_info(tokenizer, plan.tokenizer_info_path.parent, stop_token_ids=stops)


ACTIONS: dict[str, Callable[[BuildPlan], None]] = {
    "llm_api_options": _write_llm_api_options,
    "tokenizer_info": _write_tokenizer_info,
}


def build(
    plan: BuildPlan,
    *,
    runner: StepRunner = subprocess_runner,
    actions: dict[str, Callable[[BuildPlan], None]] | None = None,
    console: Any | None = None,
    force: bool = False,
    check: bool = True,
    hash_cache: FileHashCache | None = None,
) -> BuildResult:
    """Run ``plan`` unless its key is already built; returns the manifest.

    ``check`` runs :func:`preflight` first (tests inject a ``runner`` and turn it off).
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    actions = actions or ACTIONS
    if not force:
        cached = find_cached(plan.out_dir, plan.key, cache=hash_cache)
        if cached is not None:
            console.print(f"[green]cache hit[/green] {plan.key[:12]} → {plan.out_dir}")
            return BuildResult(plan=plan, manifest=cached, cache_hit=True)
    if check:
        preflight(plan)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    logs = plan.out_dir / "logs"
    logs.mkdir(exist_ok=True)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), console=console, transient=False,
    ) as progress:
        task = progress.add_task("build", total=len(plan.steps))
        for step in plan.steps:
            progress.update(task, description=f"{step.name}: {step.description}")
            _run_step(step, plan, runner=runner, actions=actions, log_path=logs / f"{step.name}.log", console=progress.console)
            progress.advance(task)
    manifest = Manifest(
        key=plan.key,
        model=plan.options.model,
        model_fingerprint=plan.model_fingerprint,
        gpu=plan.gpu.name,
        sm=plan.gpu.sm,
        arch=plan.gpu.arch,
        trtllm_version=plan.options.trtllm_version,
        backend=plan.backend,
        options=plan.options.key_options(),
        commands=plan.commands(),
        files=hash_tree(plan.out_dir, cache=hash_cache),
        sizing=plan.sizing.to_dict() if plan.sizing else {},
    )
    manifest.write(plan.out_dir)
    if hash_cache is not None:
        hash_cache.save()
    return BuildResult(plan=plan, manifest=manifest, cache_hit=False)


def _run_step(
    step: Step, plan: BuildPlan, *, runner: StepRunner, actions: dict[str, Callable[[BuildPlan], None]], log_path: Path, console: Any
) -> None:
    if step.action:
        try:
            actions[step.action](plan)
        except Exception as exc:
            log_path.write_text(f"{type(exc).__name__}: {exc}\n")
            raise BuildStepError(step.name, 1, log_path) from exc
        return
    with log_path.open("w") as log:
        log.write("$ " + step.shell() + "\n")

        def sink(line: str) -> None:
            log.write(line + "\n")
            log.flush()
            console.print(f"{step.name} | {line}", markup=False, highlight=False)

        env = dict(os.environ)
        code = runner(step.argv, sink=sink, env=env)
    if code != 0:
        raise BuildStepError(step.name, code, log_path)


_MATRIX_FIELDS = {f for f in BuildOptions.__dataclass_fields__}


def load_matrix(path: Path, **overrides: Any) -> list[BuildOptions]:
    """Build options from a YAML matrix: ``defaults:`` merged under each entry of ``builds:``.

    ::

        defaults: {trtllm_version: "0.20.0", output_root: engines, trtllm_src: /opt/TensorRT-LLM}
        builds:
          - {model: /models/Qwen2.5-7B-Instruct, gpu: h100}
          - {model: /models/Qwen2.5-7B-Instruct, gpu: l40s, quantization: fp8}
    """
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not isinstance(data.get("builds"), list) or not data["builds"]:
        raise PlanError(f"{path}: expected a mapping with a non-empty 'builds' list")
    defaults = data.get("defaults") or {}
    options: list[BuildOptions] = []
    for index, entry in enumerate(data["builds"]):
        merged = {**defaults, **(entry or {}), **{k: v for k, v in overrides.items() if v is not None}}
        unknown = set(merged) - _MATRIX_FIELDS
        if unknown:
            raise PlanError(f"{path}: build {index}: unknown fields {sorted(unknown)}")
        missing = {"model", "gpu", "trtllm_version"} - set(merged)
        if missing:
            raise PlanError(f"{path}: build {index}: missing {sorted(missing)}")
        for key in ("output_root", "trtllm_src", "calib_dataset"):
            if key in merged:
                merged[key] = Path(merged[key])
        merged["trtllm_version"] = str(merged["trtllm_version"])
        options.append(BuildOptions(**merged))
    return options


def plan_matrix(options: Iterable[BuildOptions], *, hash_cache: FileHashCache | None = None) -> list[BuildPlan]:
    return [plan_build(opts, hash_cache=hash_cache) for opts in options]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: toolrail engine build")
