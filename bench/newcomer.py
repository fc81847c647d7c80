"""A newcomer's ten requests through the real stack and the embedded model: how many end in an answer.

What a new user tries first after the README: the weather (English and Chinese), a balance, a
transfer that waits for their approval (then approved), a transfer that needs none, and two runs
that read before they write. Each request is one ``POST /v1/jobs`` on a ``LocalStack`` (its own
Redis, a real worker pool, the API) with the demo tools and the embedded model
(``TOOLRAIL_DECIDER=embedded``, the default); a call that waits for approval is approved as
decided, as the newcomer would. Nothing is scripted: the model decides every step.

A request **ends in an answer** when its job ends ``succeeded``: the model's text, or the results of
its calls where the run ends on them (``steps[-1].ended_by``); the summary also counts those answered
in words and those answered after calling a tool (a 135M model sometimes answers without calling).
Anything else — ``needs_review``, ``failed``, a timeout — is counted with the reason the record gives
(``error.type``), so a platform-made stop is visible.

Slow: the 135M model decides on CPU (tens of seconds per decision on a shared machine); the
regression tests of each platform-made cause are fast (tests/executor/test_happy_path.py).

Usage: ``python bench/newcomer.py [--out bench/results/newcomer.json] [--only 1,6]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# run as a script, bench/ is sys.path[0]: its modules must never shadow packages (bench/mcp.py vs the mcp SDK)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

APPROVE = "side_effects"
#: (request, tools, require_approval): a newcomer's own wording, not the tests' prompts.
REQUESTS: list[tuple[str, list[str], str | None]] = [
    ("What's the weather in Paris today?", ["get_weather"], None),
    ("上海今天天气怎么样", ["get_weather"], None),
    ("Is it going to be cold in Oslo tomorrow? Tell me in fahrenheit.", ["get_weather"], None),
    ("How much money does alice have?", ["query_balance"], None),
    ("Check bob's account balance please.", ["query_balance", "get_weather"], None),
    ("Send 20 USD from alice to bob.", ["transfer"], APPROVE),
    ("Transfer 12 CNY from alice to bob", ["transfer"], None),
    ("Please pay carol 15 EUR from bob's account.", ["transfer", "query_balance"], APPROVE),
    ("What's the weather in Rome tomorrow?", ["get_weather", "query_balance"], None),
    ("Look up alice's balance, then send 5 USD from alice to carol.", ["query_balance", "transfer"], APPROVE),
]


def run_one(client, number: int, text: str, tools: list[str], approval: str | None, *, timeout_s: float) -> dict:
    from executor.job_client import wait_for_job  # noqa: PLC0415

    body: dict = {"messages": [{"role": "user", "content": text}], "tools": tools}
    if approval:
        body["require_approval"] = approval
    started = time.monotonic()
    job_id = client.post("/v1/jobs", json=body).json()["job_id"]
    approved = 0
    while True:
        left = timeout_s - (time.monotonic() - started)
        job = wait_for_job(client, job_id, timeout_s=max(1.0, left), poll_s=0.5, until={"awaiting_approval"})
        if job["status"] != "awaiting_approval" or left <= 0:
            break
        for call in job["calls"]:  # the newcomer approves what the model decided, as decided
            if call["status"] == "awaiting_approval":
                client.post(f"/v1/jobs/{job_id}/calls/{call['id']}/approve")
                approved += 1
        time.sleep(0.5)
    error = job.get("error") or {}
    return {"n": number, "request": text, "status": job["status"], "answered": job["status"] == "succeeded",
            "content": (job.get("content") or "")[:200] or None, "reason": error.get("type"),
            "guard": (error.get("details") or {}).get("guard"), "approved": approved,
            "calls": [f"{c['name']}({json.dumps(c.get('arguments'), ensure_ascii=False)})={c['status']}"
                      for c in job.get("calls", [])], "steps": len(job.get("steps") or []),
            # per step, per attempt: the validators of its errors (what the platform found and re-asked on)
            "trail": [[sorted({e.get("validator") or "?" for e in a.get("errors") or []}) for a in step.get("attempts") or []]
                      for step in job.get("steps") or []], "ended_by": (job.get("steps") or [{}])[-1].get("ended_by"),
            "wall_s": round(time.monotonic() - started, 1), "job_id": job_id}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "newcomer.json")
    parser.add_argument("--only", default="", help="comma-separated request numbers (1-10) to run")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    parser.add_argument("--label", default="", help="recorded with the results (e.g. before/after)")
    args = parser.parse_args()
    os.environ["TOOLRAIL_DEMO_TOOLS"] = "get_weather,query_balance,transfer"
    os.environ.setdefault("TOOLRAIL_DECIDER", "embedded")
    import httpx  # noqa: PLC0415

    from executor.stack import LocalStack  # noqa: PLC0415
    from toolrail.settings import get_settings  # noqa: PLC0415
    from tools.registry import default_registry  # noqa: PLC0415

    get_settings.cache_clear()
    default_registry.cache_clear()
    chosen = {int(n) for n in args.only.split(",") if n.strip()} or set(range(1, len(REQUESTS) + 1))
    results = []
    with LocalStack(start_timeout_s=600) as stack, httpx.Client(base_url=stack.url, timeout=60) as client:
        for number, (text, tools, approval) in enumerate(REQUESTS, start=1):
            if number not in chosen:
                continue
            result = run_one(client, number, text, tools, approval, timeout_s=args.timeout_s)
            results.append(result)
            print(json.dumps(result, ensure_ascii=False), flush=True)
    answered = sum(r["answered"] for r in results)
    in_words = sum(bool(r["answered"] and r["content"]) for r in results)
    summary = {"label": args.label, "answered": answered, "of": len(results), "in_words": in_words,
               "called_a_tool": sum(bool(r["answered"] and r["calls"]) for r in results),
               "not_answered": dict(Counter(r["reason"] or r["status"] for r in results if not r["answered"])),
               "results": results}
    print(f"answered {answered} of {len(results)} ({in_words} in words, {summary['called_a_tool']} after calling a "
          f"tool); not answered: {summary['not_answered']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, ensure_ascii=False, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
