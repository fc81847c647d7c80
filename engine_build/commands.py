"""What ``toolrail engine plan | build | triton-repo | publish | export-hf4`` do (their parsers: ``engine_build.cli``).

Exit codes: 0 success, 1 a build step or check failed, 2 something needed is missing or
the request is invalid (the message names it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from engine_build.build import build, load_matrix
from engine_build.errors import EngineBuildError, MissingRequirementError, PlanError
from engine_build.hf_export import export_hf4
from engine_build.manifest import FileHashCache, Manifest
from engine_build.plan import BuildOptions, plan_build
from engine_build.publish import publish, publish_layout
from engine_build.tokenizer_info import stop_token_ids_for
from engine_build.triton_repo import RepoOptions, write_triton_repo

__all__ = ["cmd_build", "cmd_export_hf4", "cmd_plan", "cmd_publish", "cmd_triton_repo"]

EXIT_FAILED = 1
EXIT_USAGE = 2


_OPTION_FIELDS = (
    "model", "gpu", "trtllm_version", "backend", "revision", "model_type", "tp", "pp", "dtype", "quantization",
    "calib_dataset", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "kv_cache_free_gpu_mem_fraction",
    "workers", "output_root", "trtllm_src", "python", "task_memory_limit_mib",
)


def _options_from_args(args: argparse.Namespace) -> list[Any]:
    given = {name: getattr(args, name) for name in _OPTION_FIELDS if getattr(args, name, None) is not None}
    matrix = getattr(args, "matrix", None)
    if matrix is not None:
        return load_matrix(matrix, **given)
    missing = [f"--{name.replace('_', '-')}" for name in ("model", "gpu", "trtllm_version") if name not in given]
    if missing:
        raise PlanError(f"missing {', '.join(missing)} (or give --matrix FILE)")
    return [BuildOptions(**given)]


def _fail(exc: Exception) -> int:
    code = EXIT_USAGE if isinstance(exc, (MissingRequirementError, PlanError, FileNotFoundError, ValueError)) else EXIT_FAILED
    print(f"toolrail engine: error: {exc}", file=sys.stderr)
    return code


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        plans = [plan_build(opts) for opts in _options_from_args(args)]
    except (EngineBuildError, FileNotFoundError, ValueError) as exc:
        return _fail(exc)
    if args.json:
        print(json.dumps([plan.to_dict() for plan in plans], indent=2))
        return 0
    for plan in plans:
        print(f"# build key {plan.key}")
        print(f"# {plan.options.model} on {plan.gpu.name} (SM {plan.gpu.sm}, {plan.gpu.arch}), "
              f"TensorRT-LLM {plan.options.trtllm_version}, backend {plan.backend}")
        print(f"# output: {plan.out_dir}")
        for note in plan.notes:
            print(f"# note: {note}")
        for step in plan.steps:
            print(step.shell())
        print()
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        options = _options_from_args(args)
        cache = FileHashCache(options[0].output_root / ".hash-cache.json")
        plans = [plan_build(opts, hash_cache=cache) for opts in options]
    except (EngineBuildError, FileNotFoundError, ValueError) as exc:
        return _fail(exc)
    status = 0
    for index, plan in enumerate(plans, 1):
        console.rule(f"[{index}/{len(plans)}] {Path(plan.options.model).name} · {plan.gpu.name} · TRT-LLM {plan.options.trtllm_version}")
        if args.dry_run:
            for step in plan.steps:
                console.print(step.shell(), markup=False, highlight=False)
            continue
        try:
            result = build(plan, console=console, force=args.force, hash_cache=cache)
        except MissingRequirementError as exc:
            return _fail(exc)
        except EngineBuildError as exc:
            print(f"toolrail engine: error: {exc}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        console.print(f"{'cached' if result.cache_hit else 'built'}: {plan.out_dir}/manifest.json")
    return status


def cmd_triton_repo(args: argparse.Namespace) -> int:
    try:
        engine_dir = args.engine_dir
        flavor = args.flavor
        model = args.model
        llm_api_options: dict[str, Any] = {}
        bls_instances = None
        built: dict[str, Any] = {}
        if args.build_dir is not None:
            manifest = Manifest.read(args.build_dir)
            bls_instances = manifest.sizing.get("bls_instances")
            built = manifest.options  # the repository serves what was built: batch size, KV fraction
            flavor = flavor or manifest.backend
            model = model or manifest.model
            if manifest.backend == "engine":
                engine_dir = engine_dir or str(args.build_dir.resolve() / "engine")
            options_file = args.build_dir / "llm_api_options.yaml"
            if options_file.is_file():
                llm_api_options = yaml.safe_load(options_file.read_text()) or {}
        if not model or not flavor:
            raise PlanError("give --build-dir, or --model and --flavor")
        if flavor == "engine" and not engine_dir:
            raise PlanError("the engine flavor needs --engine-dir (or --build-dir of an engine build)")
        if flavor == "engine" and args.model_code_from is None:
            raise PlanError(
                "the engine flavor is generated from the pinned release's own templates and model code: "
                "--model-code-from <tensorrtllm_backend v0.19>/all_models/inflight_batcher_llm or, from v0.20, "
                "<TensorRT-LLM>/triton_backend/all_models/inflight_batcher_llm"
            )
        tokenizer_source = args.tokenizer or model
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
        stops = stop_token_ids_for(tokenizer, Path(tokenizer_source) if Path(tokenizer_source).is_dir() else None)
        opts = RepoOptions(
            flavor=flavor,
            output=args.output,
            model=args.server_model or model,
            tokenizer_dir=args.server_tokenizer_dir,
            engine_dir=engine_dir,
            max_batch_size=args.max_batch_size or built.get("max_batch_size", 64),
            kv_cache_free_gpu_mem_fraction=args.kv_cache_free_gpu_mem_fraction or built.get("kv_cache_free_gpu_mem_fraction", 0.85),
            triton_backend=args.triton_backend,
            llm_api_options=llm_api_options,
            model_code_from=args.model_code_from,
            copy_model_code=not args.configs_only,
            server_root=args.server_root,
            bls_instance_count=bls_instances,
        )
        result = write_triton_repo(opts, tokenizer, stop_token_ids=stops)
    except (EngineBuildError, FileNotFoundError, ValueError, OSError) as exc:
        return _fail(exc)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {result.root} (entry model: {result.entry_model}; models: {', '.join(result.models)})")
    print(f"serve with: tritonserver --model-repository {result.root}  and set TOOLRAIL_TRITON_MODEL={result.entry_model}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    try:
        if args.print_layout:
            manifest = Manifest.read(args.build_dir)
            layout = publish_layout(manifest.key, backend=manifest.backend, engine_root=args.engine_root)
            print(" ".join(f"--{key.replace('_', '-')} {value}" for key, value in layout.items()))
            return 0
        if not args.to:
            raise PlanError("give --to s3://bucket[/prefix] (or --print-layout)")
        result = publish(args.build_dir, args.to, repo_dir=args.repo, tokenizer_dir=args.tokenizer,
                         engine_root=args.engine_root, hub_egress=args.hub_egress,
                         log=lambda line: print(line, file=sys.stderr))
        if args.tfvars is not None:
            args.tfvars.write_text(json.dumps(result.deploy, indent=2, sort_keys=True) + "\n")
    except (EngineBuildError, FileNotFoundError, ValueError, OSError) as exc:
        return _fail(exc)
    print(f"published {len(result.files)} files; manifest {result.manifest_uri}")
    print(f"terraform engine variable: {json.dumps(result.deploy['engine'], sort_keys=True)}"
          + (f" (written to {args.tfvars})" if args.tfvars else ""))
    return 0


def cmd_export_hf4(args: argparse.Namespace) -> int:
    try:
        target = export_hf4(args.model, args.output, log=lambda line: print(line, file=sys.stderr))
    except (EngineBuildError, FileNotFoundError, ValueError, OSError) as exc:
        return _fail(exc)
    print(f"wrote {target}: build or serve with --model {target}")
    return 0
