"""The engine builder's commands, described: ``toolrail engine plan | build | triton-repo | publish | export-hf4``;
each names its handler in ``engine_build.commands``, loaded only when it runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine_build.plan import BACKENDS

__all__ = ["register"]


def _add_build_options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    group = parser.add_argument_group("build options")
    group.add_argument("--model", required=required, help="local HF model dir (or a hub id for the pytorch backend)")
    group.add_argument("--gpu", required=required, help="target GPU: h100, h200, a100, l40s, … or an nvidia-smi name")
    group.add_argument("--trtllm-version", required=required, help="pinned TensorRT-LLM version, e.g. 0.20.0 or 1.0.0")
    group.add_argument("--backend", choices=BACKENDS, default=None, help="engine (trtllm-build) or pytorch; auto picks by version")
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


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``engine`` and its sub-commands to the umbrella CLI."""
    engine = subparsers.add_parser(
        "engine",
        help="build TensorRT-LLM engines / PyTorch-backend configs and Triton model repositories",
        description="Engine builds per (model, GPU, TensorRT-LLM version) and Triton model repositories with guided decoding on.",
    )
    engine.set_defaults(handler=lambda args: (engine.print_help(), 0)[1])
    sub = engine.add_subparsers(dest="engine_command", metavar="SUBCOMMAND")

    plan = sub.add_parser("plan", help="print the exact build commands and the build key", description='Print the resolved steps and build key of each build.')
    _add_build_options(plan, required=False)
    plan.add_argument("--matrix", type=Path, default=None, help="YAML build matrix (defaults: + builds: list)")
    plan.add_argument("--json", action="store_true", help="print the plans as JSON")
    plan.set_defaults(handler="engine_build.commands:cmd_plan")

    build = sub.add_parser("build", help="run the builds (needs tensorrt_llm and the target GPU)", description='Run each build (skipping cache hits); one manifest per build.')
    _add_build_options(build, required=False)
    build.add_argument("--matrix", type=Path, default=None, help="YAML build matrix (defaults: + builds: list)")
    build.add_argument("--dry-run", action="store_true", help="plan and print, run nothing")
    build.add_argument("--force", action="store_true", help="rebuild even when the build key is cached")
    build.set_defaults(handler="engine_build.commands:cmd_build")

    repo = sub.add_parser("triton-repo", help="write a Triton model repository with guided decoding on", description='Write a Triton model repository for a build (engine or pytorch flavor).')
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
    repo.set_defaults(handler="engine_build.commands:cmd_triton_repo")

    pub = sub.add_parser("publish", help="upload a build + tokenizer + Triton repository to S3, manifest last",
                         description="Upload a build, its tokenizer and its Triton repository to S3; the manifest (every file's sha256) goes last.")
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
    pub.set_defaults(handler="engine_build.commands:cmd_publish")

    export = sub.add_parser("export-hf4", help="rewrite a transformers-5 model dir for transformers 4.x (TensorRT-LLM)",
                            description="Export an HF model dir saved by transformers 5 in the layout TensorRT-LLM's pinned transformers 4.x reads.")
    export.add_argument("--model", type=Path, required=True, help="HF model dir saved by transformers 5")
    export.add_argument("--output", type=Path, required=True, help="directory to write")
    export.set_defaults(handler="engine_build.commands:cmd_export_hf4")
