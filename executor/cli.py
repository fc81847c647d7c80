"""The executor's commands, described: ``toolrail serve | worker | repair | run | demo | tools list | show | check``.

Each parser names its handler as ``"module:function"``; ``toolrail.launch`` loads that module only when the command
runs (``executor.serving``, ``executor.job_client``, ``executor.tools_cli``), so ``--help`` imports argparse alone.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run the API, a worker pool and (if needed) an embedded Redis",
                                  description="Run the job API with a Celery worker pool. The Redis is --redis-url, else "
                                              "REDIS_URL, else an embedded redis-server started on a free loopback port "
                                              "(a Redis already on 6379 is used only when named). Once ready it prints, on stdout, the "
                                              "API's URL and the `export REDIS_URL=…` line a second process (toolrail "
                                              "mcp stdio, another toolrail worker) needs.")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1; others need API keys)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--concurrency", type=int, default=None,
                       help="worker processes (default: TOOLRAIL_WORKER_CONCURRENCY, 2)")
    serve.add_argument("--redis-url", default=None, metavar="URL",
                       help="use this Redis (e.g. redis://127.0.0.1:6379/0) instead of REDIS_URL or an embedded one")
    serve.add_argument("--api-workers", type=int, default=None, metavar="N",
                       help="API processes on the port (default: TOOLRAIL_API_WORKERS, 1); one process uses one core "
                            "at most")
    serve.add_argument("--no-worker", action="store_true", help="API only (workers run elsewhere)")
    serve.set_defaults(handler="executor.serving:serve")

    worker = subparsers.add_parser("worker", help="run a Celery worker (same as: celery -A executor.worker.celery worker)",
                                   description="Run a Celery worker for the given queues.")
    worker.add_argument("-Q", "--queues", default=None,
                        help="comma-separated queues (default: decide, webhooks, every tool queue and every registered "
                             "MCP server's queue)")
    worker.add_argument("-c", "--concurrency", type=int, default=None,
                        help="worker processes (default: TOOLRAIL_WORKER_CONCURRENCY, 2)")
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(handler="executor.serving:worker")

    repair = subparsers.add_parser("repair", help="clean and validate raw model output for one tool (stdin → stdout)",
                                   description="Read a tool's raw arguments (or a whole call) on stdin; print the cleaned, "
                                               "validated arguments as JSON and exit 0, or the errors and exit 2.")
    repair.add_argument("--tool", required=True, help="registered tool name")
    repair.add_argument("--notes", action="store_true", help="also print the repairs made (to stderr)")
    repair.set_defaults(handler="executor.tools_cli:repair")

    run = subparsers.add_parser("run", help="submit one job and print the result",
                                description="Submit one job (to --url, or to a local stack started for the purpose) "
                                            "and print its calls and results.")
    run.add_argument("prompt", nargs="?", default=None, help="the user's message")
    run.add_argument("--tools", default=None, help="comma-separated registered tool names (default: all)")
    run.add_argument("--raw-output", default=None, help="validate and run this raw model output instead of deciding")
    run.add_argument("--tool-calls", default=None, help="JSON list of {name, arguments} to validate and run")
    run.add_argument("--max-reasks", type=int, default=None)
    run.add_argument("--max-steps", type=int, default=None,
                     help="most decide → run steps (default: TOOLRAIL_MAX_STEPS for a prompt, 1 with --tool-calls)")
    run.add_argument("--require-approval", default=None, metavar="TOOLS",
                     help="comma-separated tools whose calls wait for your approval, or 'side_effects'")
    run.add_argument("--no-wait", action="store_true",
                     help="with --require-approval: exit 3 as soon as the job waits for a decision, instead of printing "
                          "its console URL and waiting for the decision there (or on this terminal)")
    run.add_argument("--webhook-url", default=None, help="POST job.* events here (Standard Webhooks signatures)")
    run.add_argument("--url", default=os.environ.get("TOOLRAIL_URL"), help="a running API (default: start a local stack)")
    run.add_argument("--api-key", default=os.environ.get("TOOLRAIL_API_KEY"))
    run.add_argument("--timeout", type=float, default=300.0,
                     help="one deadline, in seconds, for the whole command: starting the local stack, submitting, "
                          "waiting for a terminal status (default 300); past it, the job as it stands and exit 124")
    run.add_argument("--json", action="store_true", help="print the final job record as JSON")
    run.add_argument("--trace", action="store_true",
                     help="print the job's span tree (names, durations, process); the local stack keeps its spans in "
                          "Redis for this (TOOLRAIL_TRACE_STORE=redis); with --url, that API must keep them")
    run.set_defaults(handler="executor.job_client:run")

    demo = subparsers.add_parser("demo", help="run the main job end to end on the embedded defaults",
                                 description="Start a local stack and run three jobs: broken raw output cleaned, "
                                             "validated and executed; a decision by the embedded model on a Chinese prompt; "
                                             "and an agent run: a tool call, its result back to the model, an answer.")
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(handler="executor.job_client:demo")

    tools = subparsers.add_parser("tools", help="list, show and check the registered tools",
                                  description="The tools a worker loads: built-ins, modules in TOOLRAIL_TOOL_MODULES and "
                                              "packages declaring a 'toolrail.tools' entry point.")
    commands = tools.add_subparsers(dest="tools_command", metavar="SUBCOMMAND")
    tools.set_defaults(handler=lambda args: (tools.print_help(), 2)[1])

    listing = commands.add_parser("list", help="one line per tool: name, source, flags",
                                  description="List every tool a worker would run with where it came from: built-ins, "
                                              "modules, entry points and, with --tenant, the tenant's MCP servers.")
    listing.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    listing.add_argument("--tenant", default=None, metavar="TENANT",
                         help="also list this tenant's tools from other sources (its MCP servers), read from Redis")
    listing.add_argument("--redis-url", default=None, metavar="URL",
                         help="the deployment's Redis, for --tenant (default: REDIS_URL)")
    listing.set_defaults(handler="executor.tools_cli:list_tools")

    show = commands.add_parser("show", help="a tool's spec: schema, limits, entrypoint, source",
                               description="Print one tool's full spec as JSON.")
    show.add_argument("name", help="registered tool name")
    show.set_defaults(handler="executor.tools_cli:show_tool")

    check = commands.add_parser("check", help="import every tool module in a sandbox child and self-test the schemas",
                                description="Run the worker's start-up check: every tool module is imported inside a "
                                            "real, confined sandbox child; then each parameter schema is checked. "
                                            "Exit 0 when all pass, 1 otherwise.")
    check.add_argument("--no-sandbox", action="store_true", help="skip the sandbox import (schemas and registration only)")
    check.add_argument("--json", action="store_true", help="print the findings as JSON")
    check.set_defaults(handler="executor.tools_cli:check")
