"""Publish a finished build to S3 in the layout the Triton entrypoint (``docker/triton/entrypoint.py``) reads.

Under ``s3://<bucket>/<prefix>/<build_key>/`` (terraform's ``engines/<build_key>/``):

- ``engine/…`` (engine builds) or ``llm_api_options.yaml`` (pytorch builds), the tokenizer-info
  file and the build's own manifest (as ``build_manifest.json``), from the build directory;
- ``tokenizer/…``: the model's tokenizer and config files (preprocessing/postprocessing and the
  LLM API read them on the server);
- ``triton_repo/…``: the model repository, generated for this layout (``--server-root
  /engines/<build_key>/triton_repo`` and friends; :func:`publish_layout` names the paths);
- ``manifest.json``, uploaded **last**: every other object with its sha256, the build key,
  TensorRT-LLM version and SM, and where the model repository is. A reader that finds it finds
  everything it lists; an interrupted upload leaves no manifest, so the stack never points at it.

Before uploading, every absolute path the repository's configs give the server under the
engine root must be among the files published, or the upload is refused: a repository written
for another layout would fail on the GPU host, not here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from engine_build.config_check import load_repository
from engine_build.errors import EngineBuildError
from engine_build.manifest import MANIFEST_NAME, Manifest, hash_file

__all__ = [
    "DEFAULT_ENGINE_ROOT",
    "PUBLISH_MANIFEST_NAME",
    "PublishError",
    "PublishResult",
    "S3Client",
    "collect_files",
    "publish",
    "publish_layout",
]

#: Where the entrypoint puts a build on the GPU host (``TOOLRAIL_ENGINE_DIR``).
DEFAULT_ENGINE_ROOT = "/engines"
PUBLISH_MANIFEST_NAME = "manifest.json"
PUBLISH_MANIFEST_VERSION = 1
REPO_DIR = "triton_repo"
TOKENIZER_DIR = "tokenizer"
#: Parameters whose values are server paths (engine, tokenizer, tokenizer info, model).
_PATH_PARAMETERS = ("gpt_model_path", "tokenizer_dir", "xgrammar_tokenizer_info_path", "model", "engine_dir")
#: Files of an HF model directory the server needs besides weights.
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "added_tokens.json", "generation_config.json", "config.json", "chat_template.jinja",
)


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


def publish_layout(build_key: str, *, engine_root: str = DEFAULT_ENGINE_ROOT) -> dict[str, str]:
    """The server paths to generate the repository with (``toolrail engine triton-repo`` options)."""
    base = f"{engine_root.rstrip('/')}/{build_key}"
    return {
        "server_root": f"{base}/{REPO_DIR}",
        "engine_dir": f"{base}/engine",
        "server_tokenizer_dir": f"{base}/{TOKENIZER_DIR}",
    }


def collect_files(build_dir: Path, *, repo_dir: Path, tokenizer_dir: Path | None) -> dict[str, Path]:
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
    source = tokenizer_dir or (Path(manifest.model) if Path(manifest.model).is_dir() else None)
    if source is not None:
        found = {name: source / name for name in _TOKENIZER_FILES if (source / name).is_file()}
        if not any(name.startswith("tokenizer") for name in found):
            raise PublishError(f"{source} has no tokenizer files")
        files.update({f"{TOKENIZER_DIR}/{name}": path for name, path in found.items()})
    if not (repo_dir / "toolrail_repo_manifest.json").is_file():
        raise PublishError(
            f"{repo_dir} is not a generated model repository: run `toolrail engine triton-repo --build-dir {build_dir} "
            f"--output {repo_dir}` with the server paths publish_layout() names"
        )
    files.update(_tree(repo_dir, REPO_DIR))
    return files


def _tree(root: Path, prefix: str) -> dict[str, Path]:
    return {f"{prefix}/{path.relative_to(root).as_posix()}": path for path in sorted(root.rglob("*")) if path.is_file()}


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
    files = collect_files(build_dir, repo_dir=repo_dir, tokenizer_dir=tokenizer_dir)
    problems = _server_path_problems(repo_dir, files, build_key=build_manifest.key, engine_root=engine_root)
    if problems:
        raise PublishError("; ".join(problems))
    digests = {relative: hash_file(path) for relative, path in files.items()}
    repo_manifest = json.loads((repo_dir / "toolrail_repo_manifest.json").read_text())
    if client is None:
        try:
            import boto3
        except ImportError as exc:  # the publishing host needs it; nothing else in toolrail does
            raise PublishError("publishing needs boto3 (pip install boto3)") from exc
        client = boto3.client("s3")
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
        "files": dict(sorted(digests.items())),
    }
    client.put_object(
        Bucket=bucket, Key=f"{key_prefix}/{PUBLISH_MANIFEST_NAME}", Body=_dumps(manifest), ContentType="application/json"
    )
    uri = f"s3://{bucket}/{key_prefix}/{PUBLISH_MANIFEST_NAME}"
    log(f"published {len(files)} files; manifest {uri}")
    return PublishResult(manifest_uri=uri, files=digests)


def _dumps(data: Mapping[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
