"""The tool registry: name → ``ToolSpec``, and where each tool came from.

The default registry holds the built-in demo tools that ``TOOLRAIL_DEMO_TOOLS`` enables (none by
default: ``stress`` exists to misbehave, ``transfer`` moves demo money; a model must not be
offered them unasked) plus the tools registered by

- every module named in ``TOOLRAIL_TOOL_MODULES`` (comma separated) that defines
  ``register(registry)`` — local modules on the worker's module search path;
- every Python entry point in the group ``toolrail.tools`` (``ENTRY_POINT_GROUP``): a
  ``register(registry)`` callable, or a module that defines one — so a pip-installed
  package of tools just works.

Loading never stops at the first bad tool. A module that fails to import, a tool whose
name is taken, or a tool function whose signature cannot take its arguments is refused
with the module, the tool and the reason (``Registry.problems``); the other tools load.
The worker refuses to start when a module failed to import (``executor.sandbox.toolcheck``).
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any

from tools.builtin import BalanceArgs, StressArgs, TransferArgs, WeatherArgs
from tools.errors import ToolError, UnknownToolError
from tools.spec import ToolSpec
from toolrail.settings import get_settings

__all__ = [
    "ENTRY_POINT_GROUP",
    "Refusal",
    "Registry",
    "ToolRegistrationError",
    "DEMO_TOOLS",
    "builtin_specs",
    "check_signature",
    "demo_tools_from_settings",
    "default_registry",
    "load_registry",
    "tool_modules_from_env",
]

#: The entry point group a package of tools declares (``[project.entry-points."toolrail.tools"]``).
ENTRY_POINT_GROUP = "toolrail.tools"
BUILTIN_SOURCE = "builtin"


class ToolRegistrationError(ToolError):
    """A tool the registry refused: its module, its name and the reason are in ``details``."""

    type = "tool_registration"


@dataclass(frozen=True)
class Refusal:
    """One refused tool or tool source: where (``source``), which tool (if known), which check, why.

    The one record of a refusal: the registry keeps its loading refusals as these, and the tool checks
    (``executor.sandbox.toolcheck``) report theirs beside them.
    """

    source: str
    reason: str
    tool: str | None = None
    #: Loading: ``import`` (the module or entry point could not be loaded), ``duplicate``, ``signature`` or
    #: ``register``; the tool checks: ``sandbox import`` and ``schema``.
    kind: str = "import"
    #: Whether a worker must not start because of it (a module that cannot be imported, here or in the sandbox).
    fatal: bool = False

    def message(self) -> str:
        tool = f", tool {self.tool!r}" if self.tool else ""
        return f"{self.source}{tool}: {self.kind}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "tool": self.tool, "kind": self.kind, "reason": self.reason,
                "fatal": self.fatal}


class Registry:
    """A mapping of tool names to specs, with lookups that fail with a typed error."""

    def __init__(self, specs: Iterable[ToolSpec] = (), *, source: str = BUILTIN_SOURCE) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._sources: dict[str, str] = {}
        #: What was refused while loading (empty for a registry built by hand).
        self.problems: list[Refusal] = []
        for spec in specs:
            self.add(spec, source=source)

    def add(self, spec: ToolSpec, *, source: str = BUILTIN_SOURCE) -> None:
        if spec.name in self._specs:
            raise ToolRegistrationError(f"tool {spec.name!r} is already registered by {self._sources[spec.name]}",
                                        tool=spec.name, registered_by=self._sources[spec.name])
        self._specs[spec.name] = spec
        self._sources[spec.name] = source

    def get(self, name: str) -> ToolSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownToolError(f"unknown tool {name!r}", tool=name, known=sorted(self._specs)) from None

    def source(self, name: str) -> str:
        """Where tool ``name`` was registered: ``builtin``, ``module NAME`` or ``entry point NAME = VALUE``."""
        self.get(name)
        return self._sources[name]

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self, names: Iterable[str] | None = None) -> list[ToolSpec]:
        """Specs for ``names`` (all when None), in the order given."""
        return [self.get(n) for n in names] if names is not None else [self._specs[n] for n in self.names()]

    def queues(self) -> list[str]:
        return sorted({spec.queue_name for spec in self._specs.values() if spec.entrypoint})

    def modules(self) -> list[str]:
        """The modules holding the registered tools' functions (what a sandbox imports)."""
        return sorted({spec.entrypoint.partition(":")[0] for spec in self._specs.values() if spec.entrypoint})


class _Checked:
    """The registry as one source's ``register`` sees it: each ``add`` is checked, refusals recorded."""

    def __init__(self, registry: Registry, source: str) -> None:
        self._registry = registry
        self._source = source

    def add(self, spec: ToolSpec, **_: Any) -> None:
        if spec.name in self._registry:
            self._registry.problems.append(Refusal(self._source, f"the name is already registered by "
                                                   f"{self._registry.source(spec.name)}", spec.name, "duplicate"))
            return
        reason = check_signature(spec)
        if reason:
            self._registry.problems.append(Refusal(self._source, reason, spec.name, "signature"))
            return
        self._registry.add(spec, source=self._source)

    def __getattr__(self, name: str) -> Any:  # get, names, specs...: read-only pass-through
        return getattr(self._registry, name)

    def __contains__(self, name: object) -> bool:
        return name in self._registry


def check_signature(spec: ToolSpec) -> str | None:
    """Why ``spec``'s function cannot be called the way the sandbox calls it, or None.

    The sandbox passes the validated arguments either as one pydantic model (the first
    parameter annotated with a model class) or as keyword arguments.
    """
    if not spec.entrypoint:
        return None
    module_name, _, func_name = spec.entrypoint.partition(":")
    if not module_name or not func_name:
        return f"entrypoint {spec.entrypoint!r} is not 'module:function'"
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        return f"entrypoint {spec.entrypoint!r} cannot be loaded: {type(exc).__name__}: {exc}"
    if not callable(func):
        return f"entrypoint {spec.entrypoint!r} is not callable"
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin or C function: nothing to check
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    first = params[0] if params else None
    if first is not None and first.kind in positional and _is_model(first.annotation, func):
        if len(required) > 1:
            return (f"{func_name}{inspect.signature(func)} takes a model and more required parameters; "
                    "a tool function takes one argument model")
        return None
    properties = set((spec.parameters.get("properties") or {}).keys())
    named = {p.name for p in params if p.kind in (*positional, inspect.Parameter.KEYWORD_ONLY)}
    if any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in required):
        return f"{func_name}{inspect.signature(func)} has positional-only parameters; arguments are passed by name"
    unknown = sorted(p.name for p in required if p.name not in properties)
    if unknown:
        return (f"{func_name}{inspect.signature(func)} requires {', '.join(unknown)}, which the parameter schema "
                "does not declare")
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    missing = sorted(properties - named)
    if missing and not takes_any:
        return f"{func_name}{inspect.signature(func)} cannot take {', '.join(missing)}, declared by the parameter schema"
    return None


def _is_model(annotation: Any, func: Callable[..., Any]) -> bool:
    if isinstance(annotation, str):
        annotation = getattr(inspect.getmodule(func), annotation, None)
    return isinstance(annotation, type) and hasattr(annotation, "model_validate")


#: The built-in demo tools, registered only when named in ``TOOLRAIL_DEMO_TOOLS`` (or ``all``).
DEMO_TOOLS = ("get_weather", "query_balance", "transfer", "stress")


def builtin_specs(names: Iterable[str] = DEMO_TOOLS) -> list[ToolSpec]:
    """The built-in demo tools named in ``names`` (default: all of them)."""
    wanted = set(names)
    return [spec for spec in _all_builtin_specs() if spec.name in wanted]


def demo_tools_from_settings(value: str | None = None) -> tuple[str, ...]:
    """The demo tools a ``TOOLRAIL_DEMO_TOOLS`` value enables (default: the process settings'):
    comma-separated names, or ``all``; an unknown name is an error, not ignored."""
    if value is None:
        value = get_settings().demo_tools
    names = [name.strip() for name in value.split(",") if name.strip()]
    if names == ["all"]:
        return DEMO_TOOLS
    unknown = sorted(set(names) - set(DEMO_TOOLS))
    if unknown:
        raise ToolRegistrationError(f"TOOLRAIL_DEMO_TOOLS names {', '.join(unknown)}: the demo tools are "
                                    f"{', '.join(DEMO_TOOLS)} (or all)", unknown=unknown)
    return tuple(name for name in DEMO_TOOLS if name in names)


def _all_builtin_specs() -> list[ToolSpec]:
    return [
        ToolSpec.from_model("get_weather", WeatherArgs, entrypoint="tools.builtin:get_weather", timeout_s=5, memory_mb=512),
        ToolSpec.from_model("query_balance", BalanceArgs, entrypoint="tools.ledger:query_balance", timeout_s=5,
                            memory_mb=512, networked=True),
        ToolSpec.from_model("transfer", TransferArgs, entrypoint="tools.ledger:transfer", side_effects=True, timeout_s=10,
                            memory_mb=512, networked=True),
        ToolSpec.from_model("stress", StressArgs, entrypoint="tools.builtin:stress", timeout_s=3, memory_mb=384, cpu_s=2),
    ]


def tool_modules_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """The module names in ``TOOLRAIL_TOOL_MODULES``."""
    value = (environ if environ is not None else os.environ).get("TOOLRAIL_TOOL_MODULES", "")
    return [m.strip() for m in value.split(",") if m.strip()]


def _register_from(registry: Registry, source: str, load: Callable[[], Any]) -> None:
    """Load one source (``load`` returns a module or a ``register`` callable) and let it register."""
    try:
        target = load()
    except Exception as exc:  # noqa: BLE001 - any failure of a user's module is reported, with its reason
        registry.problems.append(Refusal(source, f"cannot be imported: {type(exc).__name__}: {exc}", fatal=True))
        return
    register = target if callable(target) and not inspect.ismodule(target) else getattr(target, "register", None)
    if not callable(register):
        registry.problems.append(Refusal(source, "defines no register(registry) function", kind="register"))
        return
    try:
        register(_Checked(registry, source))
    except Exception as exc:  # noqa: BLE001
        registry.problems.append(Refusal(source, f"register(registry) failed: {type(exc).__name__}: {exc}",
                                         kind="register"))


def load_registry(*, modules: Iterable[str] = (), entry_points: bool = True,
                  demo_tools: Iterable[str] | None = None) -> Registry:
    """The enabled demo tools (``demo_tools``; None: ``TOOLRAIL_DEMO_TOOLS``), then ``modules``, then the
    ``toolrail.tools`` entry points; refusals in ``problems``."""
    registry = Registry(builtin_specs(demo_tools_from_settings() if demo_tools is None else demo_tools))
    for module_name in modules:
        _register_from(registry, f"module {module_name}", lambda m=module_name: importlib.import_module(m))
    if entry_points:
        for point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
            dist = getattr(getattr(point, "dist", None), "name", None)
            source = f"entry point {point.name} = {point.value}" + (f" ({dist})" if dist else "")
            _register_from(registry, source, point.load)
    return registry


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The enabled demo tools plus the modules in ``TOOLRAIL_TOOL_MODULES`` and the ``toolrail.tools`` entry points."""
    registry = load_registry(modules=tool_modules_from_env())
    if registry.problems:
        from toolrail.logging import get_logger  # lazy: tools/ stays free of logging (structlog) at import

        log = get_logger("toolrail.tools")
        for problem in registry.problems:
            log.error("tools.refused", **problem.to_dict(), message=problem.message())
    return registry
