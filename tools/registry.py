"""The tool registry: name → ``ToolSpec``.

The default registry holds the built-in tools plus any module named in
``TOOLRAIL_TOOL_MODULES`` (comma separated) that defines ``register(registry)``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from functools import lru_cache

from tools.builtin import BalanceArgs, StressArgs, TransferArgs, WeatherArgs
from tools.errors import UnknownToolError
from tools.spec import ToolSpec

__all__ = ["Registry", "builtin_specs", "default_registry"]


class Registry:
    """A mapping of tool names to specs, with lookups that fail with a typed error."""

    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: ToolSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ToolSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownToolError(f"unknown tool {name!r}", tool=name, known=sorted(self._specs)) from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self, names: Iterable[str] | None = None) -> list[ToolSpec]:
        """Specs for ``names`` (all when None), in the order given."""
        return [self.get(n) for n in names] if names is not None else [self._specs[n] for n in self.names()]

    def queues(self) -> list[str]:
        return sorted({spec.queue_name for spec in self._specs.values() if spec.entrypoint})


def builtin_specs() -> list[ToolSpec]:
    """The built-in tools."""
    return [
        ToolSpec.from_model("get_weather", WeatherArgs, entrypoint="tools.builtin:get_weather", timeout_s=5, memory_mb=512),
        ToolSpec.from_model("query_balance", BalanceArgs, entrypoint="tools.builtin:query_balance", timeout_s=5,
                            memory_mb=512, networked=True),
        ToolSpec.from_model("transfer", TransferArgs, entrypoint="tools.builtin:transfer", side_effects=True, timeout_s=10,
                            memory_mb=512, networked=True),
        ToolSpec.from_model("stress", StressArgs, entrypoint="tools.builtin:stress", timeout_s=3, memory_mb=384, cpu_s=2),
    ]


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """Built-ins plus the modules listed in ``TOOLRAIL_TOOL_MODULES``."""
    registry = Registry(builtin_specs())
    for module_name in filter(None, (m.strip() for m in os.environ.get("TOOLRAIL_TOOL_MODULES", "").split(","))):
        importlib.import_module(module_name).register(registry)
    return registry
