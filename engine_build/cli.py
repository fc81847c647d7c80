"""``toolrail engine plan|build|triton-repo|publish|export-hf4``.

Exit codes: 0 success, 1 a build step or check failed, 2 something needed is missing or
the request is invalid (the message names it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from engine_build.errors import EngineBuildError, MissingRequirementError, PlanError

__all__ = ["register"]

EXIT_FAILED = 1
EXIT_USAGE = 2


def _add_build_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    from engine_build import plan as p

    group = parser.add_argument_group("build options")
    group.add_argument("--model", required=required, help="local HF model dir (or a hub id for the pytorch backend)")
    group.add_argument("--gpu", required=required, help="target GPU: h100, h200, a100, l40s, … or an nvidia-smi name")
    group.add_argument("--trtllm-version", required=required, help="pinned TensorRT-LLM version, e.g. 0.20.0 or 1.0.0")
    group.add_argument("--backend", choices=p.BACKENDS, default=None, help="engine (trtllm-build) or pytorch; auto picks by version")
    group.add_argument("--revision", default=None, help="hub revision (hub ids only)")
    group.add_argument("--model-type", default=None, help="HF model_type when it cannot be read from config.json")
    group.add_argument("--tp", type=int, default=None, help="tensor parallel size")
    group.add_argument("--pp", type=int, default=None, help="pipeline parallel size")
    group.add_argument("--dtype", choices=("auto", "bfloat16", "float16"), default=None)
    group.add_argument("--quantization", choices=("none", "fp8"), default=None)
    group.add_argument("--calib-dataset", type=Path, default=None, help="local calibration dataset directory (fp8)")
    group.add_argument("--max-batch-size", type=int, default=None)
    group.add_argument("--max-input-len", type=int, default=None)
    group.add_argument("--max-seq-len", type=int, default=None)
    group.add_argument("--max-num-tokens", type=int, default=None)
    group.add_argument("--kv-cache-free-gpu-mem-fraction", type=float, default=None)
    group.add_argument("--workers", type=int, default=None, help="trtllm-build --workers")
    group.add_argument("--output-root", type=Path, default=None, help="where build directories go (default: engines)")
    group.add_argument("--trtllm-src", type=Path, default=None, help="TensorRT-LLM source checkout of the pinned version (examples/)")
    group.add_argument("--python", default=None, help="interpreter for the example scripts (default: python3)")
    group.add_argument("--task-memory-limit-mib", type=int, default=None,
                       help="host memory of the Triton task (default: its share of the GPU's catalog instance)")


_OPTION_FIELDS = (
    "model", "gpu", "trtllm_version", "backend", "revision", "model_type", "tp", "pp", "dtype", "quantization",
    "calib_dataset", "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "kv_cache_free_gpu_mem_fraction",
    "workers", "output_root", "trtllm_src", "python", "task_memory_limit_mib",
)


def _options_from_args(args: argparse.Namespace) -> list[Any]:
    from engine_build.build import load_matrix
    from engine_build.plan import BuildOptions

    given = {name: getattr(args, name) for name in _OPTION_FIELDS if getattr(args, name, None) is not None}
    matrix = getattr(args, "matrix", None)
    if matrix is not None:
        return load_matrix(matrix, **given)
    missing = [f"--{name.replace('_', '-')}" for name in ("model", "gpu", "trtllm_version") if name not in given]
    if missing:
        raise PlanError(f"missing {', '.join(missing)} (or give --matrix FILE)")
    return [BuildOptions(**given)]


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _fail(exc: Exception) -> int:
    code = EXIT_USAGE if isinstance(exc, (MissingRequirementError, PlanError, FileNotFoundError, ValueError)) else EXIT_FAILED
    print(f"toolrail engine: error: {exc}", file=sys.stderr)
    return code


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the resolved steps and build key of each build."""
    from engine_build.plan import plan_build

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
    """Run each build (skipping cache hits); one manifest per build."""
    from engine_build.build import build
    from engine_build.manifest import FileHashCache
    from engine_build.plan import plan_build

    console = _console()
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
    """Write a Triton model repository for a build (engine or pytorch flavor)."""
    from engine_build.manifest import Manifest
    from engine_build.triton_repo import RepoOptions, write_triton_repo

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
                import yaml

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
        from engine_build.tokenizer_info import stop_token_ids_for

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
    """Upload a build, its tokenizer and its Triton repository to S3; the manifest (every file's sha256) goes last."""
    from engine_build.manifest import Manifest
    from engine_build.publish import publish, publish_layout

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
    """Export an HF model dir saved by transformers 5 in the layout TensorRT-LLM's pinned transformers 4.x reads."""
    from engine_build.hf_export import export_hf4

    try:
        target = export_hf4(args.model, args.output, log=lambda line: print(line, file=sys.stderr))
    except (EngineBuildError, FileNotFoundError, ValueError, OSError) as exc:
        return _fail(exc)
    print(f"wrote {target}: build or serve with --model {target}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``engine`` and its sub-commands to the umbrella CLI."""
    engine = subparsers.add_parser(
        "engine",
        help="build TensorRT-LLM engines / PyTorch-backend configs and Triton model repositories",
        description="Engine builds per (model, GPU, TensorRT-LLM version) and Triton model repositories with guided decoding on.",
    )
    engine.set_defaults(handler=lambda args: (engine.print_help(), 0)[1])
    sub = engine.add_subparsers(dest="engine_command", metavar="SUBCOMMAND")

    plan = sub.add_parser("plan", help="print the exact build commands and the build key", description=cmd_plan.__doc__)
    _add_build_options(plan, required=False)
    plan.add_argument("--matrix", type=Path, default=None, help="YAML build matrix (defaults: + builds: list)")
    plan.add_argument("--json", action="store_true", help="print the plans as JSON")
    plan.set_defaults(handler=cmd_plan)

    build = sub.add_parser("build", help="run the builds (needs tensorrt_llm and the target GPU)", description=cmd_build.__doc__)
    _add_build_options(build, required=False)
    build.add_argument("--matrix", type=Path, default=None, help="YAML build matrix (defaults: + builds: list)")
    build.add_argument("--dry-run", action="store_true", help="plan and print, run nothing")
    build.add_argument("--force", action="store_true", help="rebuild even when the build key is cached")
    build.set_defaults(handler=cmd_build)

    repo = sub.add_parser("triton-repo", help="write a Triton model repository with guided decoding on", description=cmd_triton_repo.__doc__)
    repo.add_argument("--output", type=Path, required=True, help="model repository directory to write")
    repo.add_argument("--build-dir", type=Path, default=None, help="a finished build directory (reads its manifest)")
    repo.add_argument("--flavor", choices=("engine", "pytorch"), default=None, help="engine (trtllm-build) or pytorch (LLM API)")
    repo.add_argument("--model", default=None, help="HF model dir or hub id")
    repo.add_argument("--tokenizer", default=None, help="tokenizer dir or id, read here (default: --model)")
    repo.add_argument("--engine-dir", default=None, help="engine directory as the server sees it")
    repo.add_argument("--model-code-from", type=Path, default=None, help="all_models/inflight_batcher_llm of the pinned release")
    repo.add_argument("--configs-only", action="store_true", help="engine flavor: write the configs (from --model-code-from templates) without copying the Python model code")
    repo.add_argument("--server-root", default=None, help="path the repository is mounted at on the server")
    repo.add_argument("--server-model", default=None, help="model path/id as the server sees it (default: --model)")
    repo.add_argument("--server-tokenizer-dir", default=None, help="tokenizer dir as the server sees it")
    repo.add_argument("--max-batch-size", type=int, default=None, help="default: the build's (else 64)")
    repo.add_argument("--kv-cache-free-gpu-mem-fraction", type=float, default=None, help="default: the build's (else 0.85)")
    repo.add_argument("--triton-backend", choices=("tensorrtllm", "python"), default="tensorrtllm")
    repo.set_defaults(handler=cmd_triton_repo)

    pub = sub.add_parser("publish", help="upload a build + tokenizer + Triton repository to S3, manifest last",
                         description=cmd_publish.__doc__)
    pub.add_argument("--build-dir", type=Path, required=True, help="a finished build directory")
    pub.add_argument("--to", default=None, help="s3://bucket[/prefix]; objects go to <prefix>/<build_key>/")
    pub.add_argument("--repo", type=Path, default=None, help="the generated model repository (default: <build-dir>/triton_repo)")
    pub.add_argument("--tokenizer", type=Path, default=None, help="tokenizer dir (default: the build's local model dir)")
    pub.add_argument("--engine-root", default="/engines", help="where the entrypoint puts builds on the GPU host")
    pub.add_argument("--hub-egress", action="store_true",
                     help="pytorch build of a hub id: the deployment gives the task a route to the hub (engine.hub_egress)")
    pub.add_argument("--tfvars", type=Path, default=None,
                     help="write terraform's engine variable here, e.g. terraform/envs/dev/engine.auto.tfvars.json")
    pub.add_argument("--print-layout", action="store_true",
                     help="print the triton-repo server-path options for this build's published layout and exit")
    pub.set_defaults(handler=cmd_publish)

    export = sub.add_parser("export-hf4", help="rewrite a transformers-5 model dir for transformers 4.x (TensorRT-LLM)",
                            description=cmd_export_hf4.__doc__)
    export.add_argument("--model", type=Path, required=True, help="HF model dir saved by transformers 5")
    export.add_argument("--output", type=Path, required=True, help="directory to write")
    export.set_defaults(handler=cmd_export_hf4)
