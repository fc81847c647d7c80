"""Load the repository's Terraform into plain Python structures for assertions.

python-hcl2 keeps string literals with their quotes (``'"abc"'``) and expressions as ``"${...}"``;
:func:`unquote` and :func:`expr` undo that so tests read naturally.
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import hcl2

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
MODULES = TERRAFORM / "modules"
ENVS = TERRAFORM / "envs"
MODULE_NAMES = ("network", "redis", "decider", "executor", "api", "observability")
ENV_NAMES = ("dev", "prod")
META_ARGUMENTS = {"source", "version", "count", "for_each", "depends_on", "providers", "__is_block__"}


def unquote(value: Any) -> Any:
    """A string literal without its quotes; anything else unchanged."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def plain(value: Any) -> Any:
    """Deeply unquoted literals and keys, without python-hcl2's ``__is_block__`` markers."""
    if isinstance(value, dict):
        return {unquote(k): plain(v) for k, v in value.items() if not str(k).startswith("__")}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return unquote(value)


def expr(value: Any) -> str:
    """An expression's source text without the ``${ }`` wrapper (strings unquoted)."""
    text = str(unquote(value))
    if text.startswith("${") and text.endswith("}"):
        return text[2:-1]
    return text


def parse_file(path: Path) -> dict[str, Any]:
    return hcl2.loads(path.read_text())


@dataclass
class Config:
    """All ``.tf`` files of one directory (a module or an environment)."""

    path: Path
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def blocks(self, kind: str) -> Iterator[dict[str, Any]]:
        for parsed in self.files.values():
            yield from parsed.get(kind, [])

    def plain_blocks(self, kind: str) -> list[dict[str, Any]]:
        return [plain(block) for block in self.blocks(kind)]

    @property
    def variables(self) -> dict[str, dict[str, Any]]:
        return {unquote(name): body for block in self.blocks("variable") for name, body in block.items()}

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return {unquote(name): body for block in self.blocks("output") for name, body in block.items()}

    @property
    def module_calls(self) -> dict[str, dict[str, Any]]:
        return {unquote(name): body for block in self.blocks("module") for name, body in block.items()}

    def resources(self, rtype: str | None = None) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """``(type, name, body)`` of every resource, optionally of one type."""
        for block in self.blocks("resource"):
            for type_label, named in block.items():
                for name, body in named.items():
                    if rtype is None or unquote(type_label) == rtype:
                        yield unquote(type_label), unquote(name), body

    def resource(self, rtype: str, name: str) -> dict[str, Any]:
        for _, found, body in self.resources(rtype):
            if found == name:
                return body
        raise KeyError(f"{rtype}.{name} not in {self.path}")

    def text(self) -> str:
        return "\n".join(path.read_text() for path in sorted(self.path.glob("*.tf")))


@dataclass
class Stack:
    modules: dict[str, Config]
    envs: dict[str, Config]

    def all_configs(self) -> Iterator[Config]:
        yield from self.modules.values()
        yield from self.envs.values()

    def tfvars(self, env: str) -> dict[str, Any]:
        """``<env>.tfvars`` with the ``*.auto.tfvars.json`` terraform loads by itself (``engine``, from publish)."""
        values = plain(parse_file(ENVS / env / f"{env}.tfvars"))
        for auto in sorted((ENVS / env).glob("*.auto.tfvars.json")):
            values.update(json.loads(auto.read_text()))
        return values


def load_config(path: Path) -> Config:
    config = Config(path=path)
    for file in sorted(path.glob("*.tf")):
        config.files[file.name] = parse_file(file)
    return config


@lru_cache(maxsize=1)
def load_stack() -> Stack:
    return Stack(
        modules={name: load_config(MODULES / name) for name in MODULE_NAMES},
        envs={name: load_config(ENVS / name) for name in ENV_NAMES},
    )


def hcl_files() -> list[Path]:
    return sorted([*TERRAFORM.rglob("*.tf"), *TERRAFORM.rglob("*.tfvars")])
