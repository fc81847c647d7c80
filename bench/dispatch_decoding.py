"""Dispatch while decoding on the embedded model: a two-call read-only job, early dispatch on vs off.

Two stacks side by side (``bench/executor.py``'s :func:`start_stack`), the same code, the embedded
decider (SmolLM2-135M-Instruct on CPU), one with ``TOOLRAIL_DISPATCH_WHILE_DECODING=1`` and one
with ``=0``; jobs alternate between them one at a time, so the machine state is the same. Each
job asks for the weather of two cities with ``get_weather`` only and ``max_steps=1`` (the run ends
with the calls). The 135M model answers such a question with one call, so the workers' decider is
the embedded one asked for at least two calls (:func:`make`, ``DecideRequest.min_calls=2``, what
the OpenAI endpoint's ``min_tool_calls`` sets): the decoding is the model's, the count is forced. From each job's record: the decision's time, the slowest call's run time, the
end-to-end time (decision start → job terminal), each call's dispatch relative to the decision's
end. Only jobs whose decision made two calls count. Usage:
``python bench/dispatch_decoding.py [--jobs 8]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_executor", Path(__file__).resolve().parent / "executor.py")
bench_executor = sys.modules["bench_executor"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_executor)

__all__ = ["AtLeastTwoCalls", "job_timing", "main", "make"]

PROMPTS = ["What's the weather in Beijing and in Shanghai tomorrow?", "Weather today in Paris and in London, please.",
           "How is the weather tomorrow in Tokyo and in Berlin?", "Tell me today's weather in Shanghai and in Beijing."]
TERMINAL = {"succeeded", "failed", "needs_review", "cancelled", "expired"}


class AtLeastTwoCalls:
    """The embedded decider asked for two calls or more (a tool-call step of a parallel two-call job)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def decide(self, request, *, on_call=None):  # noqa: ANN001, ANN201 - the decider protocol
        wanted = request.model_copy(update={"min_calls": 2, "tool_choice": "required"}) if request.tools else request
        return self.inner.decide(wanted, on_call=on_call)


def make(settings: object) -> AtLeastTwoCalls:
    """``TOOLRAIL_DECIDER=custom TOOLRAIL_DECIDER_FACTORY=bench.dispatch_decoding:make``."""
    from decider.service import get_default_decider  # noqa: PLC0415
    from toolrail.settings import Settings  # noqa: PLC0415

    return AtLeastTwoCalls(get_default_decider(Settings(decider="embedded")))


def job_timing(job: dict) -> dict | None:
    """Timing figures of a finished one-step job with two calls (None for any other shape)."""
    step = (job.get("steps") or [{}])[0]
    calls = step.get("calls") or []
    ended = step.get("decision_ended_at")
    if job.get("status") != "succeeded" or len(calls) != 2 or ended is None or any(c.get("started_at") is None for c in calls):
        return None
    started = job.get("decision_started_at") or step.get("started_at")
    runs = [c["finished_at"] - c["started_at"] for c in calls]
    return {"decision_s": ended - started, "slowest_call_s": max(runs), "tool_s": max(c.get("duration_s") or 0 for c in calls),
            "e2e_s": job["updated_at"] - started, "after_decision_s": job["updated_at"] - ended,
            "dispatched_before_end_s": [round(ended - c["dispatched_at"], 4) for c in calls],
            "started_before_end_s": [round(ended - c["started_at"], 4) for c in calls],
            "calls": [c["arguments"] for c in calls]}


def _run(stack, prompt: str) -> dict:  # noqa: ANN001 - bench_executor.Stack
    r = stack.http.post("/v1/jobs", json={"messages": [{"role": "user", "content": prompt}], "tools": ["get_weather"],
                                          "max_steps": 1})
    r.raise_for_status()
    job_id = r.json()["job_id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = stack.http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in TERMINAL:
            return job
        time.sleep(0.05)
    raise TimeoutError(job_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=8, help="jobs per mode")
    parser.add_argument("--out", default=str(bench_executor.ROOT / "bench" / "out" / "dispatch_decoding.json"))
    args = parser.parse_args()
    base = {"TOOLRAIL_DECIDER": "custom", "TOOLRAIL_DECIDER_FACTORY": "bench.dispatch_decoding:make",
            "TOOLRAIL_LOG_LEVEL": "WARNING"}
    load_before = os.getloadavg()
    timings: dict[str, list[dict]] = {"early": [], "after": []}
    shapes: dict[str, list[str]] = {"early": [], "after": []}
    with bench_executor.start_stack("early", bench_executor.ROOT, env={**base, "TOOLRAIL_DISPATCH_WHILE_DECODING": "1"}) as on, \
            bench_executor.start_stack("after", bench_executor.ROOT, env={**base, "TOOLRAIL_DISPATCH_WHILE_DECODING": "0"}) as off:
        stacks = {"early": on, "after": off}
        for name, stack in stacks.items():  # warm-up: the model loads in both worker processes
            for prompt in PROMPTS[:2]:
                _run(stack, prompt)
        for i in range(args.jobs):
            for name, stack in (stacks.items() if i % 2 == 0 else reversed(list(stacks.items()))):
                job = _run(stack, PROMPTS[i % len(PROMPTS)])
                timing = job_timing(job)
                shapes[name].append(f"{job['status']}:{len((job.get('steps') or [{}])[0].get('calls') or [])} calls")
                if timing is not None:
                    timings[name].append(timing)
                print(f"  {name:6s} {PROMPTS[i % len(PROMPTS)][:40]:40s} {timing}", file=sys.stderr)
    load_after = os.getloadavg()

    def med(name: str, key: str) -> float:
        values = [t[key] for t in timings[name]]
        return statistics.median(values) * 1000 if values else float("nan")

    print(f"\n### dispatch while decoding (embedded SmolLM2-135M, CPU; {os.cpu_count()} cores; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; medians of the two-call jobs)\n")
    print("| mode | two-call jobs | decision ms | slowest call ms | end to end ms | after decision end ms | "
          "e2e − (decision + slowest call) ms | first call queued before decision end ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in timings:
        excess = [(t["e2e_s"] - t["decision_s"] - t["slowest_call_s"]) * 1000 for t in timings[name]]
        first = [max(t["dispatched_before_end_s"]) * 1000 for t in timings[name]]
        print(f"| {'dispatch while decoding' if name == 'early' else 'dispatch after the decision'} | "
              f"{len(timings[name])} of {len(shapes[name])} | {med(name, 'decision_s'):.0f} | {med(name, 'slowest_call_s'):.0f} | "
              f"{med(name, 'e2e_s'):.0f} | {med(name, 'after_decision_s'):.0f} | "
              f"{statistics.median(excess) if excess else float('nan'):+.0f} | "
              f"{statistics.median(first) if first else float('nan'):.0f} |")
    print(f"\nSaving (median after-decision time, after − early): "
          f"{med('after', 'after_decision_s') - med('early', 'after_decision_s'):.0f} ms; "
          f"end to end: {med('after', 'e2e_s') - med('early', 'e2e_s'):.0f} ms. Shapes: {json.dumps(shapes)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"timings": timings, "shapes": shapes, "load": [load_before, load_after]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
