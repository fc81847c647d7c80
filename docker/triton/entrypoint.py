"""Start Triton on the engine named by a toolrail manifest.

The ECS task sets ``TOOLRAIL_ENGINE_MANIFEST_URI`` (``s3://bucket/engines/<build_key>/manifest.json``,
uploaded last by ``toolrail engine publish``, after every file it lists). Before ``tritonserver``
starts, this script

1. makes an S3 client for the task's region (``AWS_REGION``, else ``AWS_DEFAULT_REGION``, both set
   by terraform; instance metadata is blocked, and a region-less client would sign for us-east-1
   and go to an endpoint the S3 prefix list of another region does not cover) - refused without one;
   ``AWS_ENDPOINT_URL_S3`` (read by boto3 itself) points it at a local S3 in scripts/gpu_check.sh;
2. reads the manifest and refuses an engine built for another TensorRT-LLM version or GPU SM than
   this container and this GPU (a TensorRT engine runs only where it was built to run), and a
   model the server would fetch from a hub unless the deployment declares egress
   (``TOOLRAIL_HUB_EGRESS=true``, set by terraform from ``engine.hub_egress``);
3. downloads every file the manifest lists next to it in S3 - the model's weights or the engine
   included - and checks each sha256;
4. execs ``tritonserver`` on the model repository the manifest names (``model_repository``),
   with strict readiness so ``/v2/health/ready`` (the load balancer's health check) waits for
   the models. The repository's server paths point into ``/engines/<build_key>/`` (publish
   refuses one written for another layout).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "EngineRejected",
    "check_compatibility",
    "fetch_build",
    "manifest_files",
    "model_repository",
    "parse_s3_uri",
    "region_from",
    "safe_target",
    "server_argv",
]


class EngineRejected(Exception):
    """The engine cannot run in this container or on this GPU."""


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket or not key:
        raise ValueError(f"s3 URI needs a bucket and a key: {uri}")
    return bucket, key


def manifest_files(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Relative path -> sha256 from a manifest (``files`` as a mapping or as a list of entries)."""
    files = manifest.get("files") or {}
    if isinstance(files, Mapping):
        return {str(path): str(digest) for path, digest in files.items()}
    return {str(entry["path"]): str(entry["sha256"]) for entry in files}


def safe_target(root: Path, relative: str) -> Path:
    """``root / relative``, refusing absolute paths and ``..`` that would escape ``root``."""
    rel = PurePosixPath(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise EngineRejected(f"manifest path escapes the engine directory: {relative!r}")
    return root.joinpath(*rel.parts)


def check_compatibility(manifest: Mapping[str, Any], *, trtllm_version: str, gpu_sms: list[int]) -> None:
    """Raise :class:`EngineRejected` unless the engine fits this container and these GPUs."""
    built_with = str(manifest.get("trtllm_version", ""))
    if built_with != trtllm_version:
        raise EngineRejected(f"engine built with TensorRT-LLM {built_with!r}, this container has {trtllm_version!r}")
    sm = int(manifest.get("sm", -1))
    if not gpu_sms:
        raise EngineRejected("no GPU visible to the container")
    if any(gpu_sm != sm for gpu_sm in gpu_sms):
        raise EngineRejected(f"engine built for sm{sm}, GPUs here are {', '.join(f'sm{s}' for s in gpu_sms)}")


def model_repository(engine_dir: Path, *, hint: str | None = None) -> Path:
    """The Triton model repository inside an engine directory: ``hint``, else the parent of the
    directories that hold a ``config.pbtxt``."""
    if hint:
        return safe_target(engine_dir, hint)
    configs = sorted(engine_dir.rglob("config.pbtxt"))
    if not configs:
        raise EngineRejected(f"no config.pbtxt under {engine_dir}")
    return configs[0].parent.parent


def region_from(environ: Mapping[str, str]) -> str:
    """The task's AWS region, from the environment terraform sets; refused when there is none."""
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise EngineRejected("no AWS region: set AWS_REGION (the task definition does) so S3 is reached in the task's region")
    return region


def fetch_build(
    s3: Any, manifest_uri: str, engine_root: Path, *, trtllm_version: str, gpu_sms: list[int], hub_egress: bool
) -> tuple[Path, dict[str, Any]]:
    """Download and verify everything the manifest lists; returns the build directory and the manifest."""
    bucket, manifest_key = parse_s3_uri(manifest_uri)
    prefix = manifest_key.rsplit("/", 1)[0]
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    check_compatibility(manifest, trtllm_version=trtllm_version, gpu_sms=gpu_sms)
    if manifest.get("model_source") == "hub" and not hub_egress:
        raise EngineRejected(
            f"the model {manifest.get('model')!r} would be downloaded from a hub, and this deployment declares no egress "
            "(engine.hub_egress): publish the weights instead"
        )
    build_key = str(manifest.get("key") or manifest.get("build_key") or prefix.rsplit("/", 1)[-1])
    engine_dir = engine_root / build_key
    files = manifest_files(manifest)
    _log("engine.fetch", manifest=manifest_uri, build_key=build_key, files=len(files))
    for relative, digest in sorted(files.items()):
        target = safe_target(engine_dir, relative)
        if not (target.is_file() and _sha256(target) == digest):
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, f"{prefix}/{relative}", str(target))
        if _sha256(target) != digest:
            raise EngineRejected(f"sha256 mismatch for {relative}")
    return engine_dir, manifest


def server_argv(repository: Path, extra: list[str]) -> list[str]:
    """``tritonserver`` on ``repository``, strict readiness for the load balancer's health check."""
    return [
        "tritonserver",
        f"--model-repository={repository}",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--log-format=ISO8601",
        *extra,
    ]


def _gpu_sms() -> list[int]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [int(line.strip().replace(".", "")) for line in out.splitlines() if line.strip()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "component": "triton-entrypoint", **fields}), flush=True)


def main() -> int:
    import boto3  # installed in the image; imported here so the helpers above test without it

    manifest_uri = os.environ["TOOLRAIL_ENGINE_MANIFEST_URI"]
    engine_root = Path(os.environ.get("TOOLRAIL_ENGINE_DIR", "/engines"))
    trtllm_version = importlib.metadata.version("tensorrt_llm")
    expected = os.environ.get("TOOLRAIL_EXPECTED_TRTLLM_VERSION")
    if expected and expected != trtllm_version:
        raise EngineRejected(f"image carries TensorRT-LLM {trtllm_version}, the stack expects {expected}")

    s3 = boto3.client("s3", region_name=region_from(os.environ))
    engine_dir, manifest = fetch_build(
        s3, manifest_uri, engine_root, trtllm_version=trtllm_version, gpu_sms=_gpu_sms(),
        hub_egress=os.environ.get("TOOLRAIL_HUB_EGRESS", "false").lower() == "true",
    )
    hint = os.environ.get("TOOLRAIL_MODEL_REPOSITORY") or manifest.get("model_repository")
    repository = model_repository(engine_dir, hint=hint)
    _log("engine.ready", build_key=engine_dir.name, model_repository=str(repository), sm=manifest.get("sm"))
    args = server_argv(repository, sys.argv[1:])
    os.execvp(args[0], args)
    return 0  # unreachable


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EngineRejected as exc:
        _log("engine.rejected", error=str(exc))
        sys.exit(78)  # EX_CONFIG: ECS marks the task failed and the circuit breaker rolls back
