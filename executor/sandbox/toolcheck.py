"""Tool checks at worker start and in ``toolrail tools check``.

Three checks, each naming the module, the tool and the reason:

1. the registry's own refusals while loading (a module or entry point that fails to
   import, a duplicate name, a tool function whose signature cannot take its arguments);
2. the sandbox import: one real sandbox child, confined like any call, imports every
   tool module with the worker's module search path and reads each tool's source under
   Landlock — what a call does, before any call is accepted;
3. a schema self-test: each tool's parameter schema is valid JSON Schema and is
   accepted by the decider's schema preparation.

At worker start (``executor.worker.celery``) a failure of the first kind ``import`` or of the
second stops the worker with ``ToolCheckError``'s message; duplicate names and bad
signatures only refuse those tools (logged), and the other tools keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from decider.schema import prepare_tool
from executor.errors import PermanentError
from tools.registry import Refusal, Registry
from tools.spec import ToolSpec
from executor.sandbox.boundary import CallRun
from executor.sandbox.process import ProcessSandbox

__all__ = ["CHECK_ENTRYPOINT", "CheckReport", "ToolCheckError", "check_schema", "check_tools",
           "sandbox_import_check"]

#: The function a sandbox child runs to check the tool modules (see ``executor.sandbox.child``).
CHECK_ENTRYPOINT = "executor.sandbox.child:check_entrypoints"


class ToolCheckError(PermanentError):
    """A tool module cannot run in the sandbox: the worker does not start."""

    type = "tool_check_failed"


@dataclass
class CheckReport:
    findings: list[Refusal] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def fatal(self) -> list[Refusal]:
        return [f for f in self.findings if f.fatal]

    def failed_tools(self) -> set[str]:
        return {f.tool for f in self.findings if f.tool}


def sandbox_import_check(registry: Registry, *, sandbox_factory: Callable[..., Any] | None = None) -> list[Refusal]:
    """Import every tool module inside one real, confined sandbox child; a finding per tool that fails."""
    specs = [s for s in registry.specs() if s.entrypoint]
    if not specs:
        return []
    modules = ",".join(registry.modules())
    factory = sandbox_factory or (lambda preload: ProcessSandbox(warm=0, forkserver=False, preload=preload))
    check = ToolSpec(name="toolrail-tool-check", parameters={"type": "object", "properties": {
        "entrypoints": {"type": "array", "items": {"type": "string"}}}, "additionalProperties": False},
        entrypoint=CHECK_ENTRYPOINT, timeout_s=120, memory_mb=max(1024, *(s.memory_mb for s in specs)))
    box = factory(modules)
    try:
        result = box.run(check, CallRun(request_id="tool-check", job_id="tool-check", call_id="tool-check",
                                        idempotency_key="tool-check",
                                        arguments={"entrypoints": sorted({s.entrypoint for s in specs})}))
    except Exception as exc:  # noqa: BLE001 - the sandbox itself failing is a finding too
        return [Refusal("sandbox", f"the sandbox could not run the check: {type(exc).__name__}: {exc}",
                        kind="sandbox import", fatal=True)]
    finally:
        box.close()
    report = result.result.get("entrypoints", {})
    findings = []
    for spec in specs:
        reason = report.get(spec.entrypoint, "not checked")
        if reason:
            module = spec.entrypoint.partition(":")[0]
            source = registry.source(spec.name)
            kind = "sandbox import" if source == f"module {module}" else f"sandbox import of {module}"
            findings.append(Refusal(source, reason, spec.name, kind, fatal=True))
    return findings


def check_schema(spec: ToolSpec) -> str | None:
    """Why ``spec``'s parameter schema is unusable (invalid JSON Schema, refused by the decider), or None."""
    try:
        jsonschema.Draft202012Validator.check_schema(spec.parameters)
    except jsonschema.SchemaError as exc:
        return f"not a valid JSON Schema: {exc.message} at {'/'.join(map(str, exc.path)) or '/'}"
    if spec.parameters.get("type", "object") != "object":
        return "the parameter schema is not an object schema"
    try:
        prepare_tool(spec)
    except Exception as exc:  # noqa: BLE001 - whatever the decider refuses, with its reason
        return f"the decider cannot compile it: {type(exc).__name__}: {exc}"
    return None


def check_tools(registry: Registry, *, sandbox: bool = True, schemas: bool = True,
                sandbox_factory: Callable[..., Any] | None = None) -> CheckReport:
    """All three checks; ``report.fatal`` lists what must stop a worker."""
    report = CheckReport(checked=registry.names())
    report.findings.extend(registry.problems)
    if sandbox:
        report.findings.extend(sandbox_import_check(registry, sandbox_factory=sandbox_factory))
    if schemas:
        for spec in registry.specs():
            reason = check_schema(spec)
            if reason:
                report.findings.append(Refusal(registry.source(spec.name), reason, spec.name, "schema"))
    return report
