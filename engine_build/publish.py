"""Publish a finished build to S3 in the layout the Triton entrypoint (``docker/triton/entrypoint.py``) reads.

Under ``s3://<bucket>/<prefix>/<build_key>/`` (terraform's ``engines/<build_key>/``):

- ``engine/…`` (engine builds) or ``llm_api_options.yaml`` (pytorch builds), the tokenizer-info
  file (engine builds) and the build's own manifest (as ``build_manifest.json``);
- ``model/…``: the model's tokenizer and config files (preprocessing/postprocessing read them)
  and, for pytorch builds, its **weights** (``*.safetensors`` and their index): the LLM API
  loads ``/engines/<build_key>/model``, so the task needs no route to a model hub;
- ``triton_repo/…``: the model repository, generated for this layout (``--server-root
  /engines/<build_key>/triton_repo`` and friends; :func:`publish_layout` names the paths);
- ``manifest.json``, uploaded **last**: every other object with its sha256, the build key,
  TensorRT-LLM version and SM, where the model repository is, and the task's sizing
  (``task_memory_mib``, computed from the files uploaded: :mod:`engine_build.sizing`). A reader
  that finds it finds everything it lists; an interrupted upload leaves no manifest.

Refused before anything is uploaded: a repository whose absolute server paths are outside the
engine root or not among the files published (written for another layout); a pytorch build whose
model is a hub id, unless the deployment declares egress (``hub_egress``: the task's security
group otherwise allows 443 only to the VPC and S3, and the LLM API could not download it); a
task that does not fit its instance's memory. ``deploy`` in the manifest is terraform's
``engine`` variable (``--tfvars`` writes it as ``engine.auto.tfvars.json``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from engine_build.config_check import load_repository
from engine_build.errors import EngineBuildError
from engine_build.gpus import resolve_gpu
from engine_build.manifest import MANIFEST_NAME, Manifest, hash_file
from engine_build.sizing import TaskSizing, weight_files
from engine_build.plan import BuildOptions, plan_sizing

__all__ = [
    "DEFAULT_ENGINE_ROOT",
    "PUBLISH_MANIFEST_NAME",
    "PublishError",
    "PublishResult",
    "S3Client",
    "collect_files",
    "deploy_variables",
    "publish",
    "publish_layout",
]

#: Where the entrypoint puts a build on the GPU host (``TOOLRAIL_ENGINE_DIR``).
DEFAULT_ENGINE_ROOT = "/engines"
PUBLISH_MANIFEST_NAME = "manifest.json"
PUBLISH_MANIFEST_VERSION = 1
REPO_DIR = "triton_repo"
MODEL_DIR = "model"
#: Parameters whose values are server paths (engine, tokenizer, tokenizer info, model).
_PATH_PARAMETERS = ("gpt_model_path", "tokenizer_dir", "xgrammar_tokenizer_info_path", "model", "engine_dir")
#: Files of an HF model directory the server needs besides weights.
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "generation_config.json", "config.json", "chat_template.jinja",
)
_WEIGHT_INDEX = "model.safetensors.index.json"


class PublishError(EngineBuildError):
    """The build cannot be published as it is (missing pieces, a repository for another layout)."""


class S3Client(Protocol):
    """The two boto3 S3 client calls publishing uses."""

    def upload_file(self, Filename: str, Bucket: str, Key: str) -> None: ...

    def put_object(self, *, Bucket: str, Key: str, Body: bytes, ContentType: str) -> Any: ...


@dataclass(frozen=True)
class PublishResult:
    manifest_uri: str
    files: dict[str, str]
    #: terraform's ``engine`` variable (``{"engine": {...}}``).
    deploy: dict[str, Any]


def publish_layout(build_key: str, *, backend: str = "engine", engine_root: str = DEFAULT_ENGINE_ROOT) -> dict[str, str]:
    """The server paths to generate the repository with (``toolrail engine triton-repo`` options)."""
    base = f"{engine_root.rstrip('/')}/{build_key}"
    layout = {"server_root": f"{base}/{REPO_DIR}", "server_tokenizer_dir": f"{base}/{MODEL_DIR}"}
    if backend == "engine":
        layout["engine_dir"] = f"{base}/engine"
    else:
        layout["server_model"] = f"{base}/{MODEL_DIR}"
    return layout


def _model_source(manifest: Manifest, tokenizer_dir: Path | None, *, hub_egress: bool) -> Path | None:
    local = Path(manifest.model)
    if local.is_dir():
        return tokenizer_dir or local
    if manifest.backend == "pytorch" and not hub_egress:
        raise PublishError(
            f"{manifest.model!r} is a hub id: the Triton task reaches only the VPC and S3 (443), so the LLM API "
            "could not download it. Build from a local model directory (publish uploads its weights), or "
            "publish with --hub-egress and deploy with engine.hub_egress = true"
        )
    return tokenizer_dir


def collect_files(build_dir: Path, *, repo_dir: Path, tokenizer_dir: Path | None, hub_egress: bool = False) -> dict[str, Path]:
    """``{published relative path: local file}`` for a build."""
    manifest = Manifest.read(build_dir)
    files: dict[str, Path] = {}
    if manifest.backend == "engine":
        engine = build_dir / "engine"
        if not engine.is_dir():
            raise PublishError(f"{engine} does not exist: the engine build did not finish")
        files.update(_tree(engine, "engine"))
    options = build_dir / "llm_api_options.yaml"
    if options.is_file():
        files["llm_api_options.yaml"] = options
    info = build_dir / "tokenizer_info"
    if info.is_dir():
        files.update(_tree(info, "tokenizer_info"))
    files["build_manifest.json"] = build_dir / MANIFEST_NAME
    source = _model_source(manifest, tokenizer_dir, hub_egress=hub_egress)
    if source is not None:
        found = {name: source / name for name in _TOKENIZER_FILES if (source / name).is_file()}
        if not any(name.startswith("tokenizer") for name in found):
            raise PublishError(f"{source} has no tokenizer files")
        files.update({f"{MODEL_DIR}/{name}": path for name, path in found.items()})
    if manifest.backend == "pytorch" and Path(manifest.model).is_dir():
        weights = weight_files(Path(manifest.model))
        if not weights:
            raise PublishError(f"{manifest.model} has no *.safetensors weights for the LLM API to load")
        index = Path(manifest.model) / _WEIGHT_INDEX
        files.update({f"{MODEL_DIR}/{path.name}": path for path in [*weights, *([index] if index.is_file() else [])]})
    if not (repo_dir / "toolrail_repo_manifest.json").is_file():
        raise PublishError(
            f"{repo_dir} is not a generated model repository: run `toolrail engine triton-repo --build-dir {build_dir} "
            f"--output {repo_dir}` with the server paths publish_layout() names"
        )
    files.update(_tree(repo_dir, REPO_DIR))
    return files


def _tree(root: Path, prefix: str) -> dict[str, Path]:
    return {f"{prefix}/{path.relative_to(root).as_posix()}": path for path in sorted(root.rglob("*")) if path.is_file()}


def _bls_instances(repo_dir: Path) -> int | None:
    bls = load_repository(repo_dir).get("tensorrt_llm_bls")
    return sum(group.count for group in bls.instance_group) if bls is not None else None


def publish_sizing(build_dir: Path, files: Mapping[str, Path], *, repo_dir: Path) -> TaskSizing:
    """The task's sizing from what is published: the engine's or the weights' real bytes, the repository's BLS count."""
    manifest = Manifest.read(build_dir)
    prefix = "engine/" if manifest.backend == "engine" else f"{MODEL_DIR}/"
    weights = [path for name, path in files.items() if name.startswith(prefix) and name.endswith((".engine", ".safetensors"))]
    sizes = [path.stat().st_size for path in weights]
    config_dir = next((path.parent for name, path in files.items() if name == f"{MODEL_DIR}/config.json"), None)
    limit = manifest.sizing.get("host_limit_mib")
    options = {key: value for key, value in manifest.options.items() if key in BuildOptions.__dataclass_fields__}
    opts = BuildOptions(model=manifest.model, gpu=manifest.gpu, trtllm_version=manifest.trtllm_version,
                        backend=manifest.backend, task_memory_limit_mib=limit, **options)
    sizing = None
    if config_dir is not None:
        sizing = plan_sizing(opts, backend=manifest.backend, gpu=resolve_gpu(manifest.gpu), model_dir=config_dir,
                             weight_bytes=sum(sizes) or None, largest_file_bytes=max(sizes, default=0) or None,
                             bls_instances=_bls_instances(repo_dir))
    if sizing is None:
        raise PublishError(f"cannot size the Triton task: no config.json with the model's shape among the files of {build_dir}")
    return sizing


def deploy_variables(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Terraform's ``engine`` variable for a publish manifest."""
    keys = ("key", "gpu", "sm", "trtllm_version", "backend", "task_memory_mib", "hub_egress")
    engine = {name: manifest[name] for name in keys}
    engine["build_key"] = engine.pop("key")
    return {"engine": engine}


def _server_path_problems(repo_dir: Path, published: Iterable[str], *, build_key: str, engine_root: str) -> list[str]:
    base = PurePosixPath(engine_root) / build_key
    names = set(published)
    dirs = {str(PurePosixPath(name).parent) for name in names} | {
        str(parent) for name in names for parent in PurePosixPath(name).parents
    }
    problems = []
    for model, config in load_repository(repo_dir).items():
        for key in _PATH_PARAMETERS:
            if key not in config.parameters:
                continue
            value = config.parameters[key].string_value
            if not value.startswith("/"):
                continue
            path = PurePosixPath(value)
            if base not in path.parents and path != base:
                problems.append(f"{model}: {key} = {value} is outside {base} (the repository was written for another layout)")
                continue
            relative = str(path.relative_to(base))
            if relative not in names and relative not in dirs:
                problems.append(f"{model}: {key} = {value} is not among the published files")
    return problems


def publish(
    build_dir: Path,
    destination: str,
    *,
    repo_dir: Path | None = None,
    tokenizer_dir: Path | None = None,
    engine_root: str = DEFAULT_ENGINE_ROOT,
    hub_egress: bool = False,
    client: S3Client | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> PublishResult:
    """Upload ``build_dir`` (and its repository) to ``destination`` (``s3://bucket[/prefix]``), manifest last."""
    bucket, _, prefix = destination.removeprefix("s3://").partition("/")
    if not destination.startswith("s3://") or not bucket:
        raise PublishError(f"--to must be s3://bucket[/prefix], got {destination!r}")
    build_manifest = Manifest.read(build_dir)
    key_prefix = "/".join(part for part in (prefix.strip("/"), build_manifest.key) if part)
    repo_dir = repo_dir or build_dir / REPO_DIR
    files = collect_files(build_dir, repo_dir=repo_dir, tokenizer_dir=tokenizer_dir, hub_egress=hub_egress)
    problems = _server_path_problems(repo_dir, files, build_key=build_manifest.key, engine_root=engine_root)
    from_hub = not Path(build_manifest.model).is_dir()
    if build_manifest.backend == "pytorch" and not from_hub:
        served = load_repository(repo_dir)["llmapi"].parameters["model"].string_value
        expected = publish_layout(build_manifest.key, backend="pytorch", engine_root=engine_root)["server_model"]
        if served != expected:
            problems.append(f"llmapi: model = {served} is not the published weights ({expected})")
    if problems:
        raise PublishError("; ".join(problems))
    sizing = publish_sizing(build_dir, files, repo_dir=repo_dir)
    log(sizing.summary())
    digests = {relative: hash_file(path) for relative, path in files.items()}
    repo_manifest = json.loads((repo_dir / "toolrail_repo_manifest.json").read_text())
    if client is None:
        try:
            import boto3
        except ImportError as exc:  # the publishing host needs it; nothing else in toolrail does
            raise PublishError("publishing needs boto3 (pip install boto3)") from exc
        # botocore reads AWS_DEFAULT_REGION and the profile, not AWS_REGION; a region-less client would
        # sign for us-east-1, which a bucket in another region refuses.
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        client = boto3.client("s3", region_name=region)
    for relative, path in sorted(files.items()):
        log(f"upload {relative}")
        client.upload_file(Filename=str(path), Bucket=bucket, Key=f"{key_prefix}/{relative}")
    manifest = {
        "version": PUBLISH_MANIFEST_VERSION,
        "key": build_manifest.key,
        "trtllm_version": build_manifest.trtllm_version,
        "sm": build_manifest.sm,
        "gpu": build_manifest.gpu,
        "backend": build_manifest.backend,
        "model": build_manifest.model,
        "model_repository": REPO_DIR,
        "entry_model": repo_manifest.get("entry_model"),
        "model_source": "hub" if from_hub and build_manifest.backend == "pytorch" else "published",
        "hub_egress": bool(hub_egress),
        "task_memory_mib": sizing.task_memory_mib,
        "sizing": sizing.to_dict(),
        "files": dict(sorted(digests.items())),
    }
    manifest["deploy"] = deploy_variables(manifest)
    client.put_object(
        Bucket=bucket, Key=f"{key_prefix}/{PUBLISH_MANIFEST_NAME}", Body=_dumps(manifest), ContentType="application/json"
    )
    uri = f"s3://{bucket}/{key_prefix}/{PUBLISH_MANIFEST_NAME}"
    log(f"published {len(files)} files; manifest {uri}")
    return PublishResult(manifest_uri=uri, files=digests, deploy=manifest["deploy"])


def _dumps(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
