"""``toolrail tools list | show NAME | check`` and ``toolrail repair``: the tools a worker would load, and whether they can run.

``list`` and ``show`` read the registry exactly as a worker builds it (built-ins,
``TOOLRAIL_TOOL_MODULES``, the ``toolrail.tools`` entry points); ``list --tenant T`` adds the
tools a tenant's job may call beyond it, from the runtime's tool sources (its registered MCP
servers, read from Redis: ``--redis-url`` or ``REDIS_URL``). ``check`` runs the worker's
start-up check (every tool module imported inside a real sandbox child) and a schema
self-test; it exits 0 when every tool passes, 1 otherwise. Errors are one line on stderr. ``repair`` cleans and
validates one tool's raw arguments from stdin (``tools.check``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from executor.runtime import Runtime
from executor.sandbox.toolcheck import check_tools
from toolrail.logging import configure_logging
from toolrail.settings import get_settings
from tools.check import check_arguments
from tools.errors import UnknownToolError
from tools.registry import default_registry

__all__ = ["check", "list_tools", "repair", "show_tool"]


def _quiet() -> None:
    os.environ.setdefault("TOOLRAIL_LOG_LEVEL", "CRITICAL")
    configure_logging(level=os.environ["TOOLRAIL_LOG_LEVEL"], force=True)


def _row(registry: Any, spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "source": registry.source(spec.name), "entrypoint": spec.entrypoint,
            "side_effects": spec.side_effects, "networked": spec.networked, "timeout_s": spec.timeout_s,
            "memory_mb": spec.memory_mb, "queue": spec.queue_name}


def _tenant_rows(registry: Any, tenant: str, redis_url: str | None) -> list[dict[str, Any]]:
    """The tenant's tools beyond the registry, from the runtime's tool sources (``Runtime.tenant_specs``)."""
    runtime = Runtime.from_settings(get_settings(), redis_url=redis_url)
    runtime.registry = registry
    rows = []
    for name, spec in sorted(runtime.tenant_specs(tenant).items()):
        public = spec.public()
        rows.append({"name": name, "source": f"{public.get('source') or type(spec).__name__} (tenant {tenant})",
                     "entrypoint": spec.entrypoint, "side_effects": spec.side_effects, "networked": spec.networked,
                     "timeout_s": spec.timeout_s, "memory_mb": spec.memory_mb, "queue": spec.queue_name, "tenant": tenant})
    return rows


def list_tools(args: argparse.Namespace) -> int:
    _quiet()
    registry = default_registry()
    rows = [_row(registry, spec) for spec in registry.specs()]
    if args.tenant is not None:
        try:
            rows += _tenant_rows(registry, args.tenant, args.redis_url)
        except Exception as exc:  # noqa: BLE001 - one line, not a traceback
            print(f"toolrail tools list: cannot read tenant {args.tenant!r}'s tools: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        print(f"{'name':<24}{'flags':<22}{'timeout':>8}  source")
        for row in rows:
            flags = ",".join(f for f, on in (("side-effects", row["side_effects"]), ("networked", row["networked"])) if on)
            print(f"{row['name']:<24}{flags or '-':<22}{row['timeout_s']:>7g}s  {row['source']}")
    for problem in registry.problems:
        print(f"refused: {problem.message()}", file=sys.stderr)
    return 0


def show_tool(args: argparse.Namespace) -> int:
    _quiet()
    registry = default_registry()
    try:
        spec = registry.get(args.name)
    except UnknownToolError:
        print(f"toolrail tools show: unknown tool {args.name!r} (known: {', '.join(registry.names())})", file=sys.stderr)
        return 2
    print(json.dumps({**_row(registry, spec), "description": spec.description, "cpu_s": spec.cpu_s,
                      "allow_extra": spec.allow_extra, "parameters": spec.parameters}, ensure_ascii=False, indent=2))
    return 0


def check(args: argparse.Namespace) -> int:
    _quiet()
    registry = default_registry()
    try:
        report = check_tools(registry, sandbox=not args.no_sandbox)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        print(f"toolrail tools check: the check could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ok": report.ok, "tools": report.checked,
                          "findings": [f.to_dict() for f in report.findings]}, ensure_ascii=False, indent=2))
        return 0 if report.ok else 1
    failed = report.failed_tools()
    for name in report.checked:
        if name not in failed:
            print(f"ok    {name}  ({registry.source(name)})")
    for finding in report.findings:
        print(f"FAIL  {finding.message()}")
    print(f"{len(report.checked) - len(failed)} of {len(report.checked)} tool(s) pass"
          + (f"; {len(report.findings)} problem(s)" if report.findings else ""))
    return 0 if report.ok else 1


def repair(args: argparse.Namespace) -> int:
    try:
        spec = default_registry().get(args.tool)
    except UnknownToolError as exc:
        print(json.dumps({"error": exc.to_dict()}, ensure_ascii=False), file=sys.stderr)
        return 2
    raw = sys.stdin.read()
    unwrapped: Any = raw
    try:
        value = json.loads(raw)
        if isinstance(value, dict) and value.get("name") == args.tool and "arguments" in value:
            unwrapped = value["arguments"]
    except json.JSONDecodeError:
        pass
    check = check_arguments(spec, unwrapped)
    if args.notes and check.repairs:
        for note in check.repairs:
            print(f"repaired: {note}", file=sys.stderr)
    if check.ok:
        print(json.dumps(check.arguments, ensure_ascii=False))
        return 0
    print(json.dumps({"error": {"type": "invalid_arguments", "message": f"arguments for {args.tool} are invalid",
                                "details": {"errors": check.errors}}}, ensure_ascii=False), file=sys.stderr)
    return 2
