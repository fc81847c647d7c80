"""Build keys, file hashes and manifests.

A build is keyed by (model fingerprint, GPU SM, TensorRT-LLM version, backend, build
options). The manifest written next to the outputs records that key with the hashes
of every output file; a second build with the same key finds it and does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "FileHashCache",
    "Manifest",
    "build_key",
    "find_cached",
    "hash_file",
    "hash_tree",
    "model_fingerprint",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 1 << 20
#: Files a model fingerprint covers: weights, configs and tokenizer files.
_MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt", ".tiktoken", ".gguf", ".py", ".jinja")


class FileHashCache:
    """sha256 of files, remembered by (path, size, mtime) so a 15 GB model is read once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        if path is not None and path.is_file():
            try:
                self._entries = json.loads(path.read_text())
            except (OSError, ValueError):
                self._entries = {}

    def sha256(self, file: Path) -> str:
        stat = file.stat()
        key = str(file.resolve())
        entry = self._entries.get(key)
        if entry and entry["size"] == stat.st_size and entry["mtime_ns"] == stat.st_mtime_ns:
            return entry["sha256"]
        digest = hash_file(file)
        self._entries[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
        return digest

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._entries, sort_keys=True))
            os.replace(tmp, self.path)


def hash_file(path: Path) -> str:
    """sha256 of one file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def hash_tree(root: Path, *, cache: FileHashCache | None = None, exclude: tuple[str, ...] = (MANIFEST_NAME,)) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under ``root``, sorted."""
    hashes: dict[str, str] = {}
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root).as_posix()
        if rel in exclude or rel.startswith("logs/"):
            continue
        hashes[rel] = cache.sha256(file) if cache else hash_file(file)
    return hashes


def model_fingerprint(model: str, *, revision: str | None = None, cache: FileHashCache | None = None) -> str:
    """A stable fingerprint of a model: the hash of its files for a local dir, id@revision for a hub id."""
    path = Path(model)
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES):
            rel = file.relative_to(path).as_posix()
            if rel.startswith("."):
                continue
            digest.update(rel.encode() + b"\0")
            digest.update((cache.sha256(file) if cache else hash_file(file)).encode() + b"\n")
        return "sha256:" + digest.hexdigest()
    return f"hub:{model}@{revision or 'main'}"


def build_key(*, model_fingerprint: str, sm: int, trtllm_version: str, backend: str, options: Mapping[str, Any]) -> str:
    """The cache key of a build: sha256 of its canonical JSON description."""
    payload = {
        "manifest_version": MANIFEST_VERSION,
        "model": model_fingerprint,
        "sm": sm,
        "trtllm_version": trtllm_version,
        "backend": backend,
        "options": dict(sorted(options.items())),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(kw_only=True)
class Manifest:
    """What a finished build produced, and from what."""

    key: str
    model: str
    model_fingerprint: str
    gpu: str
    sm: int
    arch: str
    trtllm_version: str
    backend: str
    options: dict[str, Any]
    commands: list[list[str]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    #: The plan's GPU and task sizing (``engine_build.sizing.TaskSizing.to_dict``); empty when not sized.
    sizing: dict[str, Any] = field(default_factory=dict)
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    manifest_version: int = MANIFEST_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(**data)

    def write(self, out_dir: Path) -> Path:
        path = out_dir / MANIFEST_NAME
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, out_dir: Path) -> Manifest:
        return cls.from_json((out_dir / MANIFEST_NAME).read_text())

    def verify(self, out_dir: Path, *, cache: FileHashCache | None = None) -> list[str]:
        """Files that are missing or changed since the manifest was written."""
        problems = []
        for rel, digest in self.files.items():
            file = out_dir / rel
            if not file.is_file():
                problems.append(f"missing {rel}")
            elif (cache.sha256(file) if cache else hash_file(file)) != digest:
                problems.append(f"changed {rel}")
        return problems


def find_cached(out_dir: Path, key: str, *, verify: bool = True, cache: FileHashCache | None = None) -> Manifest | None:
    """The manifest in ``out_dir`` if it records ``key`` (and, with ``verify``, its files are intact)."""
    try:
        manifest = Manifest.read(out_dir)
    except (OSError, ValueError, TypeError):
        return None
    if manifest.key != key:
        return None
    if verify and manifest.verify(out_dir, cache=cache):
        return None
    return manifest
