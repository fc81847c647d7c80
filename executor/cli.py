"""``toolrail serve | worker | repair | run | demo | mcp stdio``."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

__all__ = ["register", "tcp_listener"]

DEMO_PROMPT = "北京明天天气怎么样"
DEMO_RUN_PROMPT = "What's the weather in Beijing tomorrow?"
#: The demo's built-in tool (no demo tool is registered unless ``TOOLRAIL_DEMO_TOOLS`` names it).
DEMO_TOOLS = "get_weather"
#: Printed after ``toolrail demo``: the README's next commands.
NEXT_STEPS = (
    "next:",
    f"  export TOOLRAIL_DEMO_TOOLS={DEMO_TOOLS}   # the demo's tool (no demo tool is registered by default)",
    f'  toolrail run "{DEMO_PROMPT}" --tools get_weather   # one job of your own on a local stack (--json, --trace)',
    "  toolrail serve        # the API on 127.0.0.1:8000, a worker pool and its own Redis (prints its REDIS_URL); then "
    "watch jobs and approve calls in the console: http://127.0.0.1:8000/console/",
    "  toolrail tools list   # the tools a worker loads; your own: README.md, 'Write your own tool'",
)


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
    serve.set_defaults(handler=_serve)

    worker = subparsers.add_parser("worker", help="run a Celery worker (same as: celery -A executor.worker.celery worker)",
                                   description="Run a Celery worker for the given queues.")
    worker.add_argument("-Q", "--queues", default=None,
                        help="comma-separated queues (default: decide, webhooks, every tool queue and every registered "
                             "MCP server's queue)")
    worker.add_argument("-c", "--concurrency", type=int, default=None,
                        help="worker processes (default: TOOLRAIL_WORKER_CONCURRENCY, 2)")
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(handler=_worker)

    repair = subparsers.add_parser("repair", help="clean and validate raw model output for one tool (stdin → stdout)",
                                   description="Read a tool's raw arguments (or a whole call) on stdin; print the cleaned, "
                                               "validated arguments as JSON and exit 0, or the errors and exit 2.")
    repair.add_argument("--tool", required=True, help="registered tool name")
    repair.add_argument("--notes", action="store_true", help="also print the repairs made (to stderr)")
    repair.set_defaults(handler=_repair)

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
    run.set_defaults(handler=_run)

    demo = subparsers.add_parser("demo", help="run the main job end to end on the embedded defaults",
                                 description="Start a local stack and run three jobs: broken raw output cleaned, "
                                             "validated and executed; a decision by the embedded model on a Chinese prompt; "
                                             "and an agent run: a tool call, its result back to the model, an answer.")
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(handler=_demo)

    mcp = subparsers.add_parser("mcp", help="serve toolrail's tools over MCP (stdio)",
                                description="toolrail as an MCP server. Over HTTP the API serves /mcp; this command "
                                            "serves the same tools on stdin/stdout for a local MCP host.")
    commands = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND")
    stdio = commands.add_parser("stdio", help="MCP over stdin/stdout (tenant 'default'; needs Redis and workers)")
    stdio.add_argument("--redis-url", default=None, metavar="URL", help="default: REDIS_URL")
    stdio.set_defaults(handler=_mcp_stdio)
    mcp.set_defaults(handler=lambda args: (mcp.print_help(), 2)[1])


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415

    from executor.stack import SupervisedWorker  # noqa: PLC0415
    from toolrail.logging import configure_logging, get_logger  # noqa: PLC0415
    from toolrail.redis_embed import ensure_redis  # noqa: PLC0415
    from toolrail.settings import check_redis_url, display_url  # noqa: PLC0415
    from toolrail.settings import get_settings  # noqa: PLC0415

    configure_logging()
    log = get_logger("toolrail.serve")
    if args.api_workers is not None and args.api_workers < 1:
        print(f"--api-workers must be at least 1, not {args.api_workers}", file=sys.stderr)
        return 2
    settings = get_settings()
    host = args.host or settings.host
    port = args.port or settings.port
    if not settings.tenants_by_key() and not _is_loopback(host):
        print(f"refusing to bind {host}: no API keys are configured (set TOOLRAIL_API_KEYS=key:tenant,...) "
              "— without keys only loopback addresses are allowed", file=sys.stderr)
        return 2
    if args.redis_url:
        check_redis_url(args.redis_url, source="--redis-url")
    try:  # the port first: a used one is refused before a Redis, a worker pool or another serve's Redis is touched
        listener = tcp_listener(host, port)
    except OSError as exc:
        print(f"toolrail serve: cannot listen on {host}:{port}: {_reason(exc)} (another toolrail serve or another "
              "program holds it: stop it, or choose another port with --port)", file=sys.stderr)
        return 2
    source = "--redis-url" if args.redis_url else "REDIS_URL" if settings.redis_url else "embedded"
    url, embedded = ensure_redis(args.redis_url or settings.redis_url, settings.cache_dir, redis_server=settings.redis_server)
    os.environ["REDIS_URL"] = url
    get_settings.cache_clear()
    settings = get_settings()
    log.info("serve.redis", url=display_url(url), source=source)
    worker = None
    try:
        if not args.no_worker:  # every queue of the deployment (webhooks included), restarted when it dies
            worker = SupervisedWorker(url, concurrency=args.concurrency or settings.worker_concurrency,
                                      wait_warm=settings.decider != "none").start()  # ready once it can decide
        api_workers = args.api_workers or settings.api_workers
        log.info("serve.listening", url=f"http://{host}:{port}", api_processes=api_workers)
        _announce_when_ready(host, port, url, ready_path="/healthz" if args.no_worker else "/readyz")
        if api_workers == 1:  # the app is built from the environment, as each of several processes builds it
            from executor.api.app import app_from_environment  # noqa: PLC0415

            config = uvicorn.Config(app_from_environment(), log_level="warning", access_log=False)
            uvicorn.Server(config).run(sockets=[listener])
        else:  # uvicorn's workers: each process builds its app from the environment (REDIS_URL is set above)
            from executor.metrics import MULTIPROCESS_DIR_ENV  # noqa: PLC0415

            with tempfile.TemporaryDirectory(prefix="toolrail-metrics-") as shared:
                os.environ[MULTIPROCESS_DIR_ENV] = shared
                _serve_processes(listener, api_workers)
    finally:
        listener.close()
        if worker is not None:
            worker.stop()
        if embedded:
            embedded.stop()
    return 0


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _announce_when_ready(host: str, port: int, redis_url: str, *, ready_path: str) -> None:
    """Once ``ready_path`` answers 200 (``/readyz``: the API, Redis and a warm worker pool; ``/healthz`` with
    ``--no-worker``), print on stdout the API's URL and the ``export REDIS_URL=…`` line a second process (``toolrail
    mcp stdio``, another ``toolrail worker``) needs: an embedded Redis is on a random port. A daemon thread."""
    import threading  # noqa: PLC0415

    import httpx  # noqa: PLC0415

    from toolrail.settings import display_url  # noqa: PLC0415

    probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104 - probing only

    def origin(name: str) -> str:
        return f"http://{f'[{name}]' if ':' in name else name}:{port}"

    probe = origin(probe_host) + ready_path
    shown = display_url(redis_url)
    masked = "   # password masked: the REDIS_URL you gave" if shown != redis_url else ""

    def announce() -> None:
        while True:
            try:
                if httpx.get(probe, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        print(f"toolrail serve: ready at {origin(host)}", flush=True)
        print(f"export REDIS_URL={shown}{masked}", flush=True)
        print(f"console: {origin(probe_host)}/console/", flush=True)

    threading.Thread(target=announce, name="toolrail-serve-ready", daemon=True).start()


def _serve_processes(listener: socket.socket, processes: int) -> None:
    """uvicorn's supervisor over ``processes`` API processes sharing one listening socket, bound here.

    uvicorn binds that socket with ``proto`` 0 (``Config.bind_socket``); accepted sockets inherit it, and
    asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto`` is ``IPPROTO_TCP``: every keep-alive
    request after the first then waits ~40 ms for the client's delayed ACK (Kludex/uvicorn#3149, open).
    Bound here with ``IPPROTO_TCP``, every process's connections get ``TCP_NODELAY`` as one process's do.
    """
    import uvicorn  # noqa: PLC0415
    from uvicorn.supervisors import Multiprocess  # noqa: PLC0415

    config = uvicorn.Config("executor.api.app:app_from_environment", factory=True, workers=processes, log_level="warning",
                            access_log=False)
    Multiprocess(config, sockets=[listener]).run()


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket whose accepted connections asyncio gives ``TCP_NODELAY`` (its ``proto`` is ``IPPROTO_TCP``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    listener.set_inheritable(True)
    return listener


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _worker(args: argparse.Namespace) -> int:
    from executor.stack import deployment_queues  # noqa: PLC0415
    from toolrail.redis_embed import redis_url  # noqa: PLC0415
    from toolrail.settings import get_settings  # noqa: PLC0415

    url = redis_url(get_settings())  # no REDIS_URL: one line (RedisNotConfiguredError), never a default port
    queues = args.queues or ",".join(deployment_queues(url))
    concurrency = args.concurrency or get_settings().worker_concurrency
    argv = [sys.executable, "-m", "celery", "-A", "executor.worker.celery", "worker", "-Q", queues, "-c", str(concurrency),
            "--loglevel", args.loglevel, "--without-gossip", "--without-mingle"]
    os.execvp(argv[0], argv)
    return 0  # pragma: no cover


def _repair(args: argparse.Namespace) -> int:
    from tools.check import check_arguments  # noqa: PLC0415
    from tools.errors import UnknownToolError  # noqa: PLC0415
    from tools.registry import default_registry  # noqa: PLC0415

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


def _submit_and_wait(client: Any, body: dict[str, Any], *, deadline: float, show: bool,
                     wait: bool = True) -> dict[str, Any]:
    """Submit ``body`` and wait for its end until ``deadline`` (``time.monotonic()``): one deadline for the event
    stream and the wait after it, not a timeout each. Without the event display, the submit itself waits
    (``Prefer: wait``: the finished job in the answer)."""
    wait_s = 0.0 if show else round(max(0.0, min(deadline - time.monotonic(), 60.0)), 3)
    response = client.post("/v1/jobs", json=body, headers={"Prefer": f"wait={wait_s:g}"} if wait_s else None,
                           timeout=wait_s + 30)
    if response.status_code >= 400:
        raise SystemExit(f"the API refused the job ({response.status_code}): {response.text}")
    job_id = response.json()["job_id"]
    if response.status_code == 200 and "Preference-Applied" in response.headers \
            and response.json()["status"] != "awaiting_approval":
        return response.json()  # settled within the wait: the whole record
    if show:
        print(f"job {job_id}  request_id={response.json()['request_id']}", file=sys.stderr)
        try:
            left = max(0.0, deadline - time.monotonic())
            with client.stream("GET", f"/v1/jobs/{job_id}/events", params={"timeout_s": round(left, 1)},
                               timeout=left + 5) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        _show_event(event)
                        if event.get("type") == "status" and event.get("status") == "awaiting_approval":
                            break
                        if time.monotonic() > deadline:
                            break
        except Exception as exc:  # noqa: BLE001 - progress display only; polling below decides
            print(f"  (event stream ended: {type(exc).__name__})", file=sys.stderr)
    return _wait_or_approve(client, job_id, deadline=deadline, show=show, wait=wait)


def _show_event(event: dict[str, Any]) -> None:
    kind = event.get("type")
    if kind == "status":
        print(f"  status → {event['status']}", file=sys.stderr)
    elif kind == "step":
        print(f"  step {event.get('step')} → {event.get('status')}", file=sys.stderr)
    elif kind == "call":
        print(f"  call {event.get('index')} {event.get('name')} → {event.get('status')}", file=sys.stderr)
    elif kind == "progress":
        total = f"/{event['total']}" if event.get("total") is not None else ""
        print(f"  call {event.get('index')} {event.get('name')} … {event.get('progress')}{total} "
              f"{event.get('message') or ''}".rstrip(), file=sys.stderr)


def _wait_or_approve(client: Any, job_id: str, *, deadline: float, show: bool, wait: bool = True) -> dict[str, Any]:
    """Wait for the job's end until ``deadline``. While it waits for approval: print the console URL of the job and
    wait for the decision there (also asked on a terminal); with ``wait`` false, say how to decide and return it."""
    from executor.stack import wait_for_job  # noqa: PLC0415

    while True:
        job = wait_for_job(client, job_id, timeout_s=max(0.0, deadline - time.monotonic()), poll_s=0.2,
                           until={"awaiting_approval"})
        if job.get("status") != "awaiting_approval" or time.monotonic() > deadline:
            return job
        waiting = [c for c in job.get("calls", []) if (c.get("approval") or {}).get("state") == "pending"]
        for call in waiting:
            print(f"awaiting approval: {call['name']}({json.dumps(call.get('arguments'), ensure_ascii=False)})"
                  + ("" if wait else f"  POST /v1/jobs/{job_id}/calls/{call['id']}/approve (or /reject)"), file=sys.stderr)
        print(f"decide in the console: {str(client.base_url).rstrip('/')}/console/#/jobs/{job_id}", file=sys.stderr,
              flush=True)
        if not wait:
            return job
        _await_decision(client, job_id, deadline=deadline, ask=show and sys.stdin.isatty())


def _await_decision(client: Any, job_id: str, *, deadline: float, ask: bool) -> None:
    """Until the job no longer waits (a decision in the console, here, or by any API client) or ``deadline``; with
    ``ask``, each waiting call is also asked about on this terminal."""
    import select  # noqa: PLC0415

    asked = None  # the call whose question is on the terminal
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        pending = [c for c in job.get("calls", []) if (c.get("approval") or {}).get("state") == "pending"]
        if asked is not None and asked["id"] not in {c["id"] for c in pending}:
            print("(decided elsewhere)", flush=True)  # in the console, meanwhile
            asked = None
        if job.get("status") != "awaiting_approval":
            return
        if ask and asked is None and pending:
            asked = pending[0]
            print(f"approve {asked['name']}({json.dumps(asked.get('arguments'), ensure_ascii=False)})? [y/N/reason] ",
                  end="", flush=True)
        if not (ask and asked is not None and select.select([sys.stdin], [], [], 0.2)[0]):
            time.sleep(0 if ask and asked is not None else 0.2)
            continue
        answer, call, asked = sys.stdin.readline().strip(), asked, None
        if answer.lower() in {"y", "yes"}:
            client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
        else:
            reason = answer if answer.lower() not in {"", "n", "no"} else "rejected by the operator"
            client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/reject", json={"reason": reason})


def _print_job(job: dict[str, Any]) -> None:
    print(f"status: {job['status']}   request_id: {job['request_id']}")
    steps = job.get("steps") or [{"index": 0, "attempts": job.get("attempts", []), "calls": job.get("calls", [])}]
    for step in steps:
        if len(steps) > 1:
            print(f"  step {step.get('index')}:")
        for attempt in step.get("attempts", []):
            errs = "; ".join(f"{e.get('path')}: {e.get('message')}" for e in attempt.get("errors", [])) or "ok"
            print(f"    attempt {attempt['attempt']} ({attempt['source']}): {errs}")
            for note in attempt.get("repairs", [])[:8]:
                print(f"      cleaned: {note}")
        for call in step.get("calls", []):
            outcome = call.get("result") if call["status"] == "succeeded" else call.get("error")
            print(f"    [{call['index']}] {call['name']}({json.dumps(call.get('arguments'), ensure_ascii=False)}) "
                  f"→ {call['status']}: {json.dumps(outcome, ensure_ascii=False)}")
    if job.get("content"):
        print(f"  assistant: {job['content']}")
    if job.get("error") and job["status"] != "succeeded":
        print(f"  error: {job['error'].get('type')}: {job['error'].get('message')}")


def _job_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if args.prompt:
        body["messages"] = [{"role": "user", "content": args.prompt}]
    if args.tools:
        body["tools"] = [t.strip() for t in args.tools.split(",") if t.strip()]
    if args.raw_output is not None:
        body["raw_output"] = args.raw_output
    if args.tool_calls is not None:
        try:
            body["tool_calls"] = json.loads(args.tool_calls)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--tool-calls is not JSON: {exc}") from None
    if args.max_reasks is not None:
        body["max_reasks"] = args.max_reasks
    if args.max_steps is not None:
        body["max_steps"] = args.max_steps
    if args.require_approval:
        names = [t.strip() for t in args.require_approval.split(",") if t.strip()]
        body["require_approval"] = "side_effects" if names == ["side_effects"] else names
    if args.webhook_url:
        body["webhook_url"] = args.webhook_url
    if not body.get("messages") and "raw_output" not in body and "tool_calls" not in body:
        raise SystemExit("give a prompt, --raw-output or --tool-calls (see toolrail run --help)")
    return body


def _client(url: str, api_key: str | None) -> Any:
    import httpx  # noqa: PLC0415

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def _quiet_server_logs() -> None:
    """Only warnings from the in-process API; the job's own story is printed instead."""
    from toolrail.logging import configure_logging  # noqa: PLC0415

    os.environ.setdefault("TOOLRAIL_LOG_LEVEL", "WARNING")
    configure_logging(level=os.environ["TOOLRAIL_LOG_LEVEL"], force=True)


#: ``toolrail run``'s exit status when ``--timeout`` passes before the job ends (as ``timeout(1)``'s).
TIMEOUT_EXIT = 124


def _run(args: argparse.Namespace) -> int:
    from executor.store.records import TERMINAL_JOB  # noqa: PLC0415

    deadline = time.monotonic() + args.timeout  # one deadline: the local stack's start and the job's wait
    body = _job_body(args)
    _quiet_server_logs()
    if args.trace and not args.url:
        os.environ["TOOLRAIL_TRACE_STORE"] = "redis"  # the local stack's API and workers write their spans there
    if args.url:
        with _client(args.url, args.api_key) as client:
            job = _submit_and_wait(client, body, deadline=deadline, show=not args.json, wait=not args.no_wait)
            trace = _trace(client, job) if args.trace else None
    else:
        from executor.stack import LocalStack  # noqa: PLC0415

        if not args.json:
            print("starting a local stack (Redis, worker pool, API)…", file=sys.stderr)
        stack = LocalStack(start_timeout_s=max(1.0, deadline - time.monotonic()), stop_grace_s=2.0)
        try:
            stack.start()
            if time.monotonic() >= deadline:
                raise TimeoutError("its imports and start took longer")
        except BaseException as exc:
            stack.stop_grace_s = 0
            stack.stop()  # what did start: its Redis, worker pool, API
            if not isinstance(exc, TimeoutError):
                raise
            print(f"toolrail run: --timeout {args.timeout:g} s passed while the local stack started ({exc})",
                  file=sys.stderr)
            return TIMEOUT_EXIT
        try:
            with _client(stack.url, None) as client:
                job = _submit_and_wait(client, body, deadline=deadline, show=not args.json, wait=not args.no_wait)
                trace = _trace(client, job) if args.trace else None
                if job["status"] not in TERMINAL_JOB:  # past the deadline: the stack goes with the command, at once
                    stack.stop_grace_s = 0
        except KeyboardInterrupt:  # Ctrl-C: the stack goes at once and silently (a pool told to stop mid-task
            stack.stop_grace_s = 0  # reports every busy process it loses), then the one line of toolrail.cli
            raise
        finally:
            stack.stop()
    if args.json:
        print(json.dumps(job if trace is None else {**job, "trace": trace}, ensure_ascii=False, indent=2))
    else:
        _print_job(job)
        if trace is not None:
            from executor.trace_view import render_tree  # noqa: PLC0415

            print(render_tree(trace))
    if job["status"] not in TERMINAL_JOB and job["status"] != "awaiting_approval":
        print(f"toolrail run: --timeout {args.timeout:g} s passed; job {job['job_id']} is still {job['status']}",
              file=sys.stderr)
        return TIMEOUT_EXIT
    return 0 if job["status"] == "succeeded" else 3 if job["status"] == "awaiting_approval" else 1


def _trace(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    from executor.trace_view import fetch_trace  # noqa: PLC0415

    return fetch_trace(client, job["job_id"])


def _demo(args: argparse.Namespace) -> int:
    from executor.stack import LocalStack  # noqa: PLC0415
    from tools.registry import default_registry  # noqa: PLC0415
    from toolrail.settings import get_settings  # noqa: PLC0415

    os.environ.setdefault("TOOLRAIL_DEMO_TOOLS", DEMO_TOOLS)  # the API here and the worker pool both register it
    get_settings.cache_clear()
    default_registry.cache_clear()
    _quiet_server_logs()
    broken = ("好的，我来查询：\n```json\n{“name”：“get_weather”，“arguments”：{“city”：“沪”，“date”：“明天”，}}\n```")
    print("starting a local stack (Redis, worker pool, API)…", file=sys.stderr)
    status = 0
    with LocalStack() as stack, _client(stack.url, None) as client:
        print("\n== 1. a model's broken output, cleaned, validated and executed ==")
        print(f"raw output: {broken!r}")
        job = _submit_and_wait(client, {"raw_output": broken, "tools": ["get_weather"]}, deadline=time.monotonic() + 120,
                               show=not args.json)
        print(json.dumps(job, ensure_ascii=False, indent=2)) if args.json else _print_job(job)
        status |= job["status"] != "succeeded"
        print(f"\n== 2. the embedded model decides: {DEMO_PROMPT!r} ==")
        # the client offers the tool the question is about; the model decides whether and how to call it
        job = _submit_and_wait(client, {"messages": [{"role": "user", "content": DEMO_PROMPT}], "tools": ["get_weather"],
                                        "max_steps": 1}, deadline=time.monotonic() + 600,
                               show=not args.json)
        print(json.dumps(job, ensure_ascii=False, indent=2)) if args.json else _print_job(job)
        status |= job["status"] != "succeeded"
        print(f"\n== 3. an agent run: the model calls a tool, reads its result and answers: {DEMO_RUN_PROMPT!r} ==")
        job = _submit_and_wait(client, {"messages": [{"role": "user", "content": DEMO_RUN_PROMPT}], "tools": ["get_weather"]},
                               deadline=time.monotonic() + 900, show=not args.json)
        print(json.dumps(job, ensure_ascii=False, indent=2)) if args.json else _print_job(job)
        status |= job["status"] != "succeeded"
    print("\n" + "\n".join(NEXT_STEPS), file=sys.stderr if args.json else sys.stdout)
    return int(status)


def _mcp_stdio(args: argparse.Namespace) -> int:
    """``toolrail mcp stdio``: the same handlers as ``/mcp`` on stdin/stdout for a local host (tenant ``default``),
    over this process's Redis (``REDIS_URL``) and the running workers. Logs go to stderr; stdout carries nothing but
    the protocol."""
    from toolrail.settings import get_settings  # noqa: PLC0415

    if args.redis_url:  # the job store and the Celery app publishing its tasks: one Redis (the app reads REDIS_URL)
        os.environ["REDIS_URL"] = args.redis_url
        get_settings.cache_clear()
    from executor.api.context import JobDesk  # noqa: PLC0415
    from executor.runtime import Runtime  # noqa: PLC0415
    from executor.worker.tasks import QUEUES  # noqa: PLC0415 - the Celery app reads REDIS_URL at import
    from mcpbridge.server import serve_stdio  # noqa: PLC0415 - the MCP SDK only where MCP is served
    from toolrail.redis_embed import redis_url  # noqa: PLC0415

    settings = get_settings()
    # REDIS_URL or --redis-url, never a guessed default port: nothing set is one line (RedisNotConfiguredError)
    runtime = Runtime.from_settings(settings, redis_url=redis_url(settings), queues=QUEUES)
    runtime.redis.ping()  # a missing Redis is one line (toolrail.cli.one_line_error), before the host waits on us
    runtime.registry = _workers_registry(runtime.redis)
    serve_stdio(JobDesk(runtime, QUEUES.decide, QUEUES.dispatch), settings)
    return 0


def _workers_registry(client: Any) -> Any:
    """The registry the workers load (their demo tools and tool modules, as they published them at start), loaded
    here; a tool they serve that this process cannot load stops the command with one line naming it and why."""
    from executor.store.worker_tools import published  # noqa: PLC0415
    from tools.registry import load_registry  # noqa: PLC0415

    workers = published(client)
    if not workers:
        raise SystemExit("toolrail mcp stdio: no worker has published its tools on this Redis (each does at its "
                         "start): start the workers first (toolrail serve)")
    modules = list(dict.fromkeys(module for worker in workers for module in worker.modules))
    registry = load_registry(modules=modules, demo_tools={name for worker in workers for name in worker.demo_tools})
    served = {name: worker.worker for worker in reversed(workers) for name in worker.tools}
    missing = sorted(set(served) - set(registry.names()))
    if missing:
        why = "; ".join(problem.message() for problem in registry.problems) or \
            f"its modules ({', '.join(modules) or 'none'}) did not register them here"
        raise SystemExit(f"toolrail mcp stdio: the workers serve {', '.join(missing)} (worker "
                         f"{served[missing[0]]}), which this process cannot load: {why}. Run it in the workers' "
                         "Python environment")
    return registry
