"""``toolrail run`` and ``toolrail demo``: jobs submitted to an API (``--url``, or a local stack started for the
purpose) and followed to their end on this terminal: their events, an approval asked here or in the console, the
final record or its span tree."""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from typing import Any

import httpx

from executor.store.records import TERMINAL_JOB
from executor.trace_view import fetch_trace, render_tree
from toolrail.logging import configure_logging
from toolrail.settings import get_settings
from tools.registry import default_registry

__all__ = ["DEMO_TOOLS", "NEXT_STEPS", "TIMEOUT_EXIT", "demo", "run", "wait_for_job"]

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


def wait_for_job(client: object, job_id: str, *, timeout_s: float = 60.0, poll_s: float = 0.1,
                 headers: dict[str, str] | None = None, until: set[str] | frozenset[str] = frozenset()) -> dict:
    """Wait until the job is terminal (or in a status of ``until``) with ``GET /v1/jobs/{id}?wait=``: the API answers
    the moment the job settles, no polling. At the deadline, the last record seen. ``poll_s``: the pause before
    asking again while the job waits for approval and ``until`` does not name it (the API answers such a wait at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        wait_s = round(max(0.0, min(deadline - time.monotonic(), 20.0)), 3)
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": wait_s}, headers=headers,  # type: ignore[attr-defined]
                         timeout=wait_s + 30).json()
        if job.get("status") in TERMINAL_JOB or job.get("status") in until or time.monotonic() > deadline:
            return job
        if job.get("status") == "awaiting_approval":
            time.sleep(poll_s)


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
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def _local_stack(**options: Any) -> Any:
    """A whole toolrail on this machine, not started yet (``executor.stack.LocalStack``)."""
    from executor.stack import LocalStack  # lazy: Redis, a worker pool and the API only where no --url names an API

    return LocalStack(**options)


def _quiet_server_logs() -> None:
    """Only warnings from the in-process API; the job's own story is printed instead."""
    os.environ.setdefault("TOOLRAIL_LOG_LEVEL", "WARNING")
    configure_logging(level=os.environ["TOOLRAIL_LOG_LEVEL"], force=True)


#: ``toolrail run``'s exit status when ``--timeout`` passes before the job ends (as ``timeout(1)``'s).
TIMEOUT_EXIT = 124


def run(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout  # one deadline: the local stack's start and the job's wait
    body = _job_body(args)
    _quiet_server_logs()
    if args.trace and not args.url:
        os.environ["TOOLRAIL_TRACE_STORE"] = "redis"  # the local stack's API and workers write their spans there
    if args.url:
        with _client(args.url, args.api_key) as client:
            job = _submit_and_wait(client, body, deadline=deadline, show=not args.json, wait=not args.no_wait)
            trace = fetch_trace(client, job["job_id"]) if args.trace else None
    else:
        if not args.json:
            print("starting a local stack (Redis, worker pool, API)…", file=sys.stderr)
        stack = _local_stack(start_timeout_s=max(1.0, deadline - time.monotonic()), stop_grace_s=2.0)
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
                trace = fetch_trace(client, job["job_id"]) if args.trace else None
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
            print(render_tree(trace))
    if job["status"] not in TERMINAL_JOB and job["status"] != "awaiting_approval":
        print(f"toolrail run: --timeout {args.timeout:g} s passed; job {job['job_id']} is still {job['status']}",
              file=sys.stderr)
        return TIMEOUT_EXIT
    return 0 if job["status"] == "succeeded" else 3 if job["status"] == "awaiting_approval" else 1


def demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("TOOLRAIL_DEMO_TOOLS", DEMO_TOOLS)  # the API here and the worker pool both register it
    get_settings.cache_clear()
    default_registry.cache_clear()
    _quiet_server_logs()
    broken = ("好的，我来查询：\n```json\n{“name”：“get_weather”，“arguments”：{“city”：“沪”，“date”：“明天”，}}\n```")
    print("starting a local stack (Redis, worker pool, API)…", file=sys.stderr)
    status = 0
    with _local_stack() as stack, _client(stack.url, None) as client:
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

