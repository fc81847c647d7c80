"""``toolrail mcp stdio`` and ``toolrail tools add-mcp | list-mcp | remove-mcp``.

``mcp stdio`` serves toolrail's tools over MCP on stdin/stdout for a local host (tenant ``default``):
the same handlers as ``/mcp``, over this process's Redis (``REDIS_URL``) and the running workers, with the
tools the workers load (as they published them: ``executor.store.worker_tools``), never the ones this process's
own environment would name; it refuses to start, naming them, when it cannot load one of theirs.
Logs go to stderr; stdout carries nothing but the protocol.

``tools add-mcp NAME (--url URL | --command ARGV...)`` registers an MCP server with a running API
(``--api``, ``TOOLRAIL_URL``, default http://127.0.0.1:8000; ``TOOLRAIL_API_KEY`` as the bearer). It
prints the server's tools and the ones refused, and exits 0 when it was registered, 1 when the API
refused it (one line on stderr: the error type and message), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["register"]

DEFAULT_API = "http://127.0.0.1:8000"


def register(subparsers: argparse._SubParsersAction) -> None:
    mcp = subparsers.add_parser("mcp", help="serve toolrail's tools over MCP (stdio)",
                                description="toolrail as an MCP server. Over HTTP the API serves /mcp; this command "
                                            "serves the same tools on stdin/stdout for a local MCP host.")
    commands = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND")
    stdio = commands.add_parser("stdio", help="MCP over stdin/stdout (tenant 'default'; needs Redis and workers)")
    stdio.add_argument("--redis-url", default=None, metavar="URL", help="default: REDIS_URL")
    stdio.set_defaults(handler="mcpbridge.stdio:serve")
    mcp.set_defaults(handler=lambda args: (mcp.print_help(), 2)[1])

    tools = subparsers.choices.get("tools")  # executor.cli's group: add the MCP subcommands to it
    if tools is None:
        return
    group = next(a for a in tools._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    add = group.add_parser("add-mcp", help="register an MCP server's tools with a running API",
                           description="Register an MCP server (streamable HTTP URL or stdio command) with the API; "
                                       "its tools become mcp__NAME__TOOL. Exit 0 when registered, 1 when refused.")
    add.add_argument("name", help="server name: 1-20 of a-z 0-9 _ -")
    where = add.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the server's streamable HTTP endpoint")
    where.add_argument("--command", nargs=argparse.REMAINDER, metavar="ARGV",
                       help="stdio: the command and its arguments (must come last)")
    add.add_argument("--api", default=None, help=f"the API (default: TOOLRAIL_URL or {DEFAULT_API})")
    add.add_argument("--network", action="store_true", help="stdio: the server may use the network")
    add.add_argument("--read-path", action="append", default=[], metavar="PATH",
                     help="stdio: a path the server may read, e.g. its script's folder (repeatable; under the "
                          "operator's TOOLRAIL_MCP_STDIO_READ_ROOTS)")
    add.add_argument("--side-effects", action="append", default=[], metavar="TOOL",
                     help="treat this remote tool as side-effecting (repeatable)")
    add.add_argument("--read-only", action="append", default=[], metavar="TOOL",
                     help="this remote tool only reads, whatever its annotations say (MCP's default for a tool "
                          "without readOnlyHint: it may change things) (repeatable)")
    add.add_argument("--requires-approval", action="append", default=[], metavar="TOOL",
                     help="a person approves each call of this remote tool (repeatable)")
    add.add_argument("--timeout", type=float, default=None, help="hard cap of one call, seconds")
    add.add_argument("--idle-timeout", type=float, default=None, help="seconds without progress before giving up")
    add.add_argument("--json", action="store_true", help="print the API's answer as JSON")
    add.set_defaults(handler=_add)

    listing = group.add_parser("list-mcp", help="the MCP servers registered with the API")
    listing.add_argument("--api", default=None)
    listing.set_defaults(handler=_list)
    remove = group.add_parser("remove-mcp", help="forget an MCP server")
    remove.add_argument("name")
    remove.add_argument("--api", default=None)
    remove.set_defaults(handler=_remove)


def _client(api: str | None) -> Any:
    import httpx  # noqa: PLC0415

    headers = {"Authorization": f"Bearer {os.environ['TOOLRAIL_API_KEY']}"} if os.environ.get("TOOLRAIL_API_KEY") else {}
    return httpx.Client(base_url=api or os.environ.get("TOOLRAIL_URL") or DEFAULT_API, headers=headers, timeout=120)


def _refused(prog: str, response: Any) -> int:
    try:
        error = response.json()["error"]
        line = f"{error['type']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        line = f"HTTP {response.status_code}: {response.text[:300]}"
    print(f"toolrail tools {prog}: {line}", file=sys.stderr)
    return 1


def _add(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "side_effects": args.side_effects, "read_only": args.read_only,
                            "requires_approval": args.requires_approval}
    if args.url:
        body["url"] = args.url
    else:
        command = [part for part in args.command if part != "--"] if args.command else []
        if not command:
            print("toolrail tools add-mcp: --command needs the server's command", file=sys.stderr)
            return 2
        body.update(command=command, network=args.network, read_paths=args.read_path)
    if args.timeout is not None:
        body["timeout_s"] = args.timeout
    if args.idle_timeout is not None:
        body["idle_timeout_s"] = args.idle_timeout
    with _client(args.api) as client:
        response = client.post("/v1/mcp-servers", json=body)
    if response.status_code not in (200, 201):
        return _refused("add-mcp", response)
    server = response.json()
    if args.json:
        print(json.dumps(server, ensure_ascii=False, indent=2))
        return 0
    print(f"registered {server['name']}: {len(server['tools'])} tool(s), {len(server['refused'])} refused "
          f"(queue {server['queue']})")
    for tool in server["tools"]:
        flags = ",".join(f for f, on in (("side-effects", tool["side_effects"]),
                                          ("approval", tool["requires_approval"])) if on)
        print(f"  {tool['name']:<40} {flags or '-'}")
    for refusal in server["refused"]:
        print(f"  refused: {refusal['message']} (at {refusal['details'].get('path')})")
    return 0


def _list(args: argparse.Namespace) -> int:
    with _client(args.api) as client:
        response = client.get("/v1/mcp-servers")
    if response.status_code != 200:
        return _refused("list-mcp", response)
    for server in response.json()["servers"]:
        where = server.get("url") or " ".join(server.get("command") or [])
        print(f"{server['name']:<20} {len(server['tools']):>3} tool(s)  {where}")
    return 0


def _remove(args: argparse.Namespace) -> int:
    with _client(args.api) as client:
        response = client.delete(f"/v1/mcp-servers/{args.name}")
    if response.status_code != 200:
        return _refused("remove-mcp", response)
    print(f"removed {args.name}")
    return 0
