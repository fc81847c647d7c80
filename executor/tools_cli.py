"""``toolrail tools list | show NAME | check``: the tools a worker would load, and whether they can run.

``list`` and ``show`` read the registry exactly as a worker builds it (built-ins,
``TOOLRAIL_TOOL_MODULES``, the ``toolrail.tools`` entry points); ``list --tenant T`` adds the
tools a tenant's job may call beyond it, from the runtime's tool sources (its registered MCP
servers, read from Redis: ``--redis-url`` or ``REDIS_URL``). ``check`` runs the worker's
start-up check (every tool module imported inside a real sandbox child) and a schema
self-test; it exits 0 when every tool passes, 1 otherwise. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    tools = subparsers.add_parser("tools", help="list, show and check the registered tools",
                                  description="The tools a worker loads: built-ins, modules in TOOLRAIL_TOOL_MODULES and "
                                              "packages declaring a 'toolrail.tools' entry point.")
    commands = tools.add_subparsers(dest="tools_command", metavar="SUBCOMMAND")
    tools.set_defaults(handler=lambda args: _usage(tools))

    listing = commands.add_parser("list", help="one line per tool: name, source, flags",
                                  description="List every tool a worker would run with where it came from: built-ins, "
                                              "modules, entry points and, with --tenant, the tenant's MCP servers.")
    listing.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    listing.add_argument("--tenant", default=None, metavar="TENANT",
                         help="also list this tenant's tools from other sources (its MCP servers), read from Redis")
    listing.add_argument("--redis-url", default=None, metavar="URL",
                         help="the deployment's Redis, for --tenant (default: REDIS_URL)")
    listing.set_defaults(handler=_list)

    show = commands.add_parser("show", help="a tool's spec: schema, limits, entrypoint, source",
                               description="Print one tool's full spec as JSON.")
    show.add_argument("name", help="registered tool name")
    show.set_defaults(handler=_show)

    check = commands.add_parser("check", help="import every tool module in a sandbox child and self-test the schemas",
                                description="Run the worker's start-up check: every tool module is imported inside a "
                                            "real, confined sandbox child; then each parameter schema is checked. "
                                            "Exit 0 when all pass, 1 otherwise.")
    check.add_argument("--no-sandbox", action="store_true", help="skip the sandbox import (schemas and registration only)")
    check.add_argument("--json", action="store_true", help="print the findings as JSON")
    check.set_defaults(handler=_check)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _registry() -> Any:
    from tools.registry import default_registry  # noqa: PLC0415

    return default_registry()


def _quiet() -> None:
    import os  # noqa: PLC0415

    from toolrail.logging import configure_logging  # noqa: PLC0415

    os.environ.setdefault("TOOLRAIL_LOG_LEVEL", "CRITICAL")
    configure_logging(level=os.environ["TOOLRAIL_LOG_LEVEL"], force=True)


def _row(registry: Any, spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "source": registry.source(spec.name), "entrypoint": spec.entrypoint,
            "side_effects": spec.side_effects, "networked": spec.networked, "timeout_s": spec.timeout_s,
            "memory_mb": spec.memory_mb, "queue": spec.queue_name}


def _tenant_rows(registry: Any, tenant: str, redis_url: str | None) -> list[dict[str, Any]]:
    """The tenant's tools beyond the registry, from the runtime's tool sources (``Runtime.tenant_specs``)."""
    from executor.runtime import Runtime  # noqa: PLC0415 - Redis and the tool sources only when asked
    from toolrail.settings import get_settings  # noqa: PLC0415

    runtime = Runtime.from_settings(get_settings(), redis_url=redis_url)
    runtime.registry = registry
    rows = []
    for name, spec in sorted(runtime.tenant_specs(tenant).items()):
        public = spec.public()
        rows.append({"name": name, "source": f"{public.get('source') or type(spec).__name__} (tenant {tenant})",
                     "entrypoint": spec.entrypoint, "side_effects": spec.side_effects, "networked": spec.networked,
                     "timeout_s": spec.timeout_s, "memory_mb": spec.memory_mb, "queue": spec.queue_name, "tenant": tenant})
    return rows


def _list(args: argparse.Namespace) -> int:
    _quiet()
    registry = _registry()
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


def _show(args: argparse.Namespace) -> int:
    from tools.errors import UnknownToolError  # noqa: PLC0415

    _quiet()
    registry = _registry()
    try:
        spec = registry.get(args.name)
    except UnknownToolError:
        print(f"toolrail tools show: unknown tool {args.name!r} (known: {', '.join(registry.names())})", file=sys.stderr)
        return 2
    print(json.dumps({**_row(registry, spec), "description": spec.description, "cpu_s": spec.cpu_s,
                      "allow_extra": spec.allow_extra, "parameters": spec.parameters}, ensure_ascii=False, indent=2))
    return 0


def _check(args: argparse.Namespace) -> int:
    from executor.sandbox.toolcheck import check_tools  # noqa: PLC0415

    _quiet()
    registry = _registry()
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
