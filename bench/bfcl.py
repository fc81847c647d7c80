"""BFCL, the Berkeley Function Calling Leaderboard, as the yardstick: toolrail beside the raw model.

Rows, ground truth, prompts, the output parser and the AST checker all come from the ``bfcl-eval``
package (its own data files, never copied here). Each sampled row is run twice, in one process,
on one embedded engine:

- **toolrail**: the row's functions as OpenAI tools (BFCL's own ``convert_to_tool``, dots in
  names replaced as for every OpenAI-style model), ``tool_choice`` left to the model, through the
  platform's ``POST /v1/chat/completions`` app in-process (the openai SDK over an ASGI transport:
  the same path a client takes, check and re-ask loop included); the reply is decoded as BFCL
  decodes a function-calling model's (``[{name: json.loads(arguments)}]``).
- **raw**: the same model without toolrail, in BFCL's prompting mode: its system prompt
  (``system_prompt_pre_processing_chat_model``), the model's chat template, free greedy
  generation, BFCL's own output parser (``default_decode_ast_prompting``).

Both are scored by BFCL's ``ast_checker`` (AST categories) or its relevance rule (irrelevance:
right when no call decodes). Per category: accuracy, calls made, extra-call rows (more calls than
the ground truth holds; any call on an irrelevance row), rows whose calls the checker rejects,
non-200 answers, latency. The target average is over simple, multiple, irrelevance, live_simple
and live_irrelevance.

Tuning rule: knobs are tuned on one seed's rows and reported on another's (``--seed``); a figure
on rows that were tuned on is not a measurement.

Usage::

    python -m bench.bfcl                              # 25 rows per category, seed 2
    python -m bench.bfcl --rows 10 --seed 1 --set call_bias=0 --no-raw
    python -m bench.bfcl --all --out bench/results/bfcl.md
    python -m bench.bfcl --no-toolrail --details /tmp/raw.json      # the raw model alone, kept...
    python -m bench.bfcl --raw-from /tmp/raw.json                   # ...beside toolrail runs on the same rows

The checker's module imports BFCL's whole model registry (every provider SDK) to read one flag,
``underscore_to_dot``; that registry is replaced by a two-entry table before the import.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import random
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance", "live_simple", "live_multiple",
              "live_irrelevance")
#: The five categories the issue's target averages over.
TARGET_CATEGORIES = ("simple", "multiple", "irrelevance", "live_simple", "live_irrelevance")
#: BFCL's file name for our category names (v4 splits "simple" by language).
BFCL_NAMES = {"simple": "simple_python"}
DEFAULT_ROWS = 25
DEFAULT_SEED = 2
RAW_MAX_TOKENS = 192
TOOLRAIL_MAX_TOKENS = 256
#: Names the checker is told about: toolrail gets names with "." replaced (OpenAI tool names), raw keeps them.
TOOLRAIL, RAW = "toolrail", "raw"


def _bfcl() -> types.SimpleNamespace:
    """BFCL's loaders, prompt builder, parser and checker (imported late: they are a test extra)."""
    from dataclasses import dataclass

    @dataclass
    class _Config:
        underscore_to_dot: bool

    registry = types.ModuleType("bfcl_eval.constants.model_config")
    registry.MODEL_CONFIG_MAPPING = {TOOLRAIL: _Config(True), RAW: _Config(False)}  # type: ignore[attr-defined]
    sys.modules.setdefault("bfcl_eval.constants.model_config", registry)
    from bfcl_eval import utils
    from bfcl_eval.constants import enums, type_mappings
    from bfcl_eval.eval_checker.ast_eval import ast_checker
    from bfcl_eval.model_handler import utils as handler_utils

    return types.SimpleNamespace(
        Language=enums.Language, ModelStyle=enums.ModelStyle, ReturnFormat=enums.ReturnFormat,
        GORILLA_TO_OPENAPI=type_mappings.GORILLA_TO_OPENAPI, ast_checker=ast_checker.ast_checker,
        convert_to_tool=handler_utils.convert_to_tool,
        default_decode_ast_prompting=handler_utils.default_decode_ast_prompting,
        system_prompt_pre_processing_chat_model=handler_utils.system_prompt_pre_processing_chat_model,
        is_empty_output=utils.is_empty_output, is_function_calling_format_output=utils.is_function_calling_format_output,
        load_dataset_entry=utils.load_dataset_entry, load_ground_truth_entry=utils.load_ground_truth_entry)


# ------------------------------------------------------------------------------------------------ rows


def sample_rows(bfcl: Any, category: str, *, rows: int | None, seed: int) -> list[dict[str, Any]]:
    """A seeded sample of ``category`` (all rows when ``rows`` is None), each with its ground truth."""
    name = BFCL_NAMES.get(category, category)
    entries = bfcl.load_dataset_entry(name)
    truth = {} if "irrelevance" in category else {g["id"]: g["ground_truth"] for g in bfcl.load_ground_truth_entry(name)}
    picked = range(len(entries)) if rows is None or rows >= len(entries) else \
        sorted(random.Random(f"{seed}:{category}").sample(range(len(entries)), rows))
    return [{"category": category, "entry": entries[i], "truth": truth.get(entries[i]["id"])} for i in picked]


def expected_calls(row: dict[str, Any]) -> int:
    return len(row["truth"] or [])


def score(bfcl: Any, row: dict[str, Any], decoded: list[dict[str, Any]] | None, model: str) -> tuple[bool, str]:
    """BFCL's verdict on one decoded output (None: nothing decoded) and its error type."""
    if "irrelevance" in row["category"]:
        called = decoded is not None and not bfcl.is_empty_output(decoded)
        return not called, "irrelevance_error:decoder_success" if called else ""
    if decoded is None:
        return False, "ast_decoder:decoder_failed"
    if not bfcl.is_function_calling_format_output(decoded):
        return False, "ast_decoder:decoder_wrong_output_format"
    verdict = bfcl.ast_checker(row["entry"]["function"], decoded, row["truth"], bfcl.Language.PYTHON,
                               row["category"], model)
    return bool(verdict["valid"]), "" if verdict["valid"] else str(verdict.get("error_type", "invalid"))


def call_count(decoded: list[dict[str, Any]] | None) -> int:
    return len(decoded) if isinstance(decoded, list) else 0


# ------------------------------------------------------------------------------------------------ runners


@dataclasses.dataclass
class Outcome:
    category: str
    row_id: str
    right: bool
    calls: int
    expected: int
    error_type: str = ""
    status: int = 200
    latency_s: float = 0.0
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def extra(self) -> bool:
        return self.calls > self.expected

    @property
    def rejected(self) -> bool:
        """Calls were made and the checker rejected them (irrelevance: any call)."""
        return self.calls > 0 and not self.right


async def run_toolrail(bfcl: Any, client: Any, row: dict[str, Any]) -> Outcome:
    entry = row["entry"]
    tools = bfcl.convert_to_tool(entry["function"], bfcl.GORILLA_TO_OPENAPI, bfcl.ModelStyle.OPENAI_COMPLETIONS)
    import openai

    started = time.perf_counter()
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="toolrail", messages=copy.deepcopy(entry["question"][0]), tools=tools,
            max_tokens=TOOLRAIL_MAX_TOKENS, extra_headers={"X-Request-ID": f"bfcl-{entry['id']}"})
        status, body = raw.http_response.status_code, json.loads(raw.http_response.text)
    except openai.APIStatusError as exc:  # a non-200 answer is a wrong row, whatever the category
        status, body = exc.status_code, exc.body if isinstance(exc.body, dict) else {}
    outcome = Outcome(row["category"], entry["id"], False, 0, expected_calls(row), status=status,
                      latency_s=time.perf_counter() - started)
    if status != 200:
        error = body.get("error", body) if isinstance(body, dict) else {}
        outcome.error_type = f"http_{status}:{error.get('type')}"
        outcome.detail = {"message": str(error.get("message"))[:300]}
        return outcome
    choice = body["choices"][0]
    message = choice["message"]
    decoded = None
    if message.get("tool_calls"):
        try:  # BFCL's decode of a function-calling model's reply
            decoded = [{c["function"]["name"]: json.loads(c["function"]["arguments"])} for c in message["tool_calls"]]
        except (ValueError, KeyError):
            decoded = None
    outcome.right, outcome.error_type = score(bfcl, row, decoded, TOOLRAIL)
    outcome.calls = call_count(decoded)
    record = body.get("toolrail") or {}
    last = (record.get("attempts") or [{}])[-1]
    platform = last.get("platform", {})
    reads = platform.get("call_count_read")
    outcome.detail = {"finish_reason": choice.get("finish_reason"), "decoded": decoded,
                      "content": message.get("content"), "status": record.get("status"),
                      "attempts": len(record.get("attempts") or []), "raw_output": last.get("raw_output"),
                      "platform": platform,
                      "count_read_cut": bool(reads) and platform.get("calls_after_read") == len(reads)}
    return outcome


async def run_raw(bfcl: Any, engine: Any, row: dict[str, Any]) -> Outcome:
    from decider.backend import GenerationRequest

    entry = row["entry"]
    messages = bfcl.system_prompt_pre_processing_chat_model(copy.deepcopy(entry["question"][0]),
                                                            copy.deepcopy(entry["function"]), entry["id"])
    prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    started = time.perf_counter()
    parts = []
    async for chunk in engine.generate(GenerationRequest(request_id=f"bfcl-raw-{entry['id']}", prompt=prompt,
                                                         max_tokens=RAW_MAX_TOKENS)):
        parts.append(chunk.text)
    latency = time.perf_counter() - started
    text = "".join(parts)
    try:
        decoded = bfcl.default_decode_ast_prompting(text, bfcl.ReturnFormat.PYTHON)
    except Exception:  # noqa: BLE001 - BFCL counts any decode failure as "no call decoded"
        decoded = None
    right, error_type = score(bfcl, row, decoded, RAW)
    return Outcome(row["category"], entry["id"], right, call_count(decoded), expected_calls(row), error_type,
                   latency_s=latency, detail={"text": text[:400]})


async def run_all(rows: list[dict[str, Any]], runner: Any, *, label: str, concurrency: int) -> list[Outcome]:
    """Run ``runner`` over ``rows``, ``concurrency`` at a time, printing one progress line per row."""
    gate = asyncio.Semaphore(concurrency)
    done = 0
    started = time.perf_counter()

    async def one(row: dict[str, Any]) -> Outcome:
        nonlocal done
        async with gate:
            try:
                outcome = await runner(row)
            except Exception as exc:  # noqa: BLE001 - a failed row is a wrong row, reported
                outcome = Outcome(row["category"], row["entry"]["id"], False, 0, expected_calls(row),
                                  f"exception:{type(exc).__name__}", status=0, detail={"error": str(exc)[:300]})
        done += 1
        print(f"[{label} {done}/{len(rows)} {time.perf_counter() - started:.0f}s] {outcome.row_id}: "
              f"{'right' if outcome.right else 'wrong'} calls={outcome.calls}/{outcome.expected} "
              f"{outcome.error_type} {outcome.latency_s:.1f}s", file=sys.stderr, flush=True)
        return outcome

    return list(await asyncio.gather(*(one(row) for row in rows)))


# ------------------------------------------------------------------------------------------------ report


def summarize(outcomes: list[Outcome]) -> dict[str, dict[str, Any]]:
    by: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by.setdefault(outcome.category, []).append(outcome)
    summary = {}
    for category in CATEGORIES:
        group = by.get(category)
        if not group:
            continue
        latencies = sorted(o.latency_s for o in group)
        summary[category] = {
            "rows": len(group), "right": sum(o.right for o in group),
            "accuracy": sum(o.right for o in group) / len(group),
            "calls": sum(o.calls for o in group), "extra_rows": sum(o.extra for o in group),
            "rejected_rows": sum(o.rejected for o in group),
            "errors": sum(o.status != 200 for o in group),
            "length_stops": sum(o.detail.get("finish_reason") == "length" for o in group),
            "count_read_cuts": sum(bool(o.detail.get("count_read_cut")) for o in group),
            "errors_5xx": sum(o.status >= 500 or o.status == 0 for o in group),
            "latency_median_s": statistics.median(latencies),
            "latency_p90_s": latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
        }
    return summary


def target_average(summary: dict[str, dict[str, Any]]) -> float | None:
    present = [summary[c]["accuracy"] for c in TARGET_CATEGORIES if c in summary]
    return sum(present) / len(present) if len(present) == len(TARGET_CATEGORIES) else None


def _accuracy(summary: dict[str, Any] | None) -> str:
    return f"{summary['right']}/{summary['rows']} ({100 * summary['accuracy']:.0f} %)" if summary else "-"


def markdown(summaries: dict[str, dict[str, dict[str, Any]]], *, meta: dict[str, Any]) -> str:
    lines = [f"# BFCL (bfcl-eval {meta['bfcl_version']}): toolrail vs the raw model", "",
             f"Model: embedded default ({meta['model']}); seed {meta['seed']}, "
             f"{meta['rows'] if meta['rows'] else 'all'} rows per category, the same rows for both; "
             f"overrides of the embedded profile: {meta['profile']}. Run: `{meta['command']}` ({meta['wall_s']:.0f} s)"
             + "".join(f"; {who} outcomes are those of `{meta[key]}` on the same rows" for who, key in
                       (("toolrail's", "toolrail_command"), ("the raw model's", "raw_command")) if meta.get(key))
             + ".", "",
             "| category | rows | toolrail | raw | toolrail calls | extra-call rows | checker-rejected rows | non-200 |"
             " length stops | calls dropped by the count read | toolrail s (median/p90) | raw s (median) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ours, raw = summaries.get(TOOLRAIL, {}), summaries.get(RAW, {})
    for category in CATEGORIES:
        o, r = ours.get(category), raw.get(category)
        if o is None and r is None:
            continue
        rows = (o or r)["rows"]
        lines.append(" | ".join([
            f"| {category}", str(rows), _accuracy(o), _accuracy(r),
            str(o["calls"]) if o else "-",
            f"{o['extra_rows']} ({100 * o['extra_rows'] / rows:.0f} %)" if o else "-",
            str(o["rejected_rows"]) if o else "-", str(o["errors"]) if o else "-",
            str(o["length_stops"]) if o else "-", str(o["count_read_cuts"]) if o else "-",
            f"{o['latency_median_s']:.1f}/{o['latency_p90_s']:.1f}" if o else "-",
            f"{r['latency_median_s']:.1f} |" if r else "- |"]))
    avg = {k: target_average(v) for k, v in summaries.items()}
    fmt = (lambda v: f"{100 * v:.1f} %" if v is not None else "n/a")
    lines += ["", f"Average over {', '.join(TARGET_CATEGORIES)}: toolrail **{fmt(avg.get(TOOLRAIL))}**, "
              f"raw model **{fmt(avg.get(RAW))}**."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ main


def _saved_outcomes(path: Path, name: str, rows: list[dict[str, Any]], *, seed: int) -> list[Outcome]:
    """``name``'s outcomes from an earlier ``--details`` file of the same rows (same seed, same ids): the raw
    model does not change with the platform, and it is the slow half of a run."""
    saved = json.loads(path.read_text("utf-8"))
    by_id = {o["row_id"]: Outcome(**o) for o in saved["rows"].get(name, [])}
    missing = [row["entry"]["id"] for row in rows if row["entry"]["id"] not in by_id]
    if saved["meta"]["seed"] != seed or missing:
        raise SystemExit(f"{path}: not {name} on these rows (seed {saved['meta']['seed']}, {len(missing)} missing)")
    return [by_id[row["entry"]["id"]] for row in rows]


def _profile(overrides: list[str]) -> Any:
    from decider.service import EMBEDDED_PROFILE

    values: dict[str, Any] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        values[key] = None if value == "none" else json.loads(value)
    return dataclasses.replace(EMBEDDED_PROFILE, **values)


async def _main(args: argparse.Namespace) -> int:
    import httpx
    import openai

    from decider.openai_api import create_app
    from decider.service import EMBEDDED_PROFILE, EmbeddedDecider

    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # progress lines only
    bfcl = _bfcl()
    categories = args.categories.split(",") if args.categories else list(CATEGORIES)
    rows = [row for c in categories for row in sample_rows(bfcl, c, rows=None if args.all else args.rows, seed=args.seed)]
    profile = _profile(args.set)
    decider = EmbeddedDecider.load(config=profile, num_threads=args.threads)
    started = time.perf_counter()
    outcomes: dict[str, list[Outcome]] = {}
    if args.toolrail_from is not None:
        outcomes[TOOLRAIL] = _saved_outcomes(args.toolrail_from, TOOLRAIL, rows, seed=args.seed)
    elif not args.no_toolrail:
        app = create_app(lambda: decider)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://toolrail", timeout=600)
        client = openai.AsyncOpenAI(base_url="http://toolrail/v1", api_key="unused", http_client=http, max_retries=0)
        outcomes[TOOLRAIL] = await run_all(rows, lambda row: run_toolrail(bfcl, client, row), label=TOOLRAIL,
                                           concurrency=args.concurrency)
        await http.aclose()
    if args.raw_from is not None:
        outcomes[RAW] = _saved_outcomes(args.raw_from, RAW, rows, seed=args.seed)
    elif not args.no_raw:
        outcomes[RAW] = await run_all(rows, lambda row: run_raw(bfcl, decider.backend, row), label=RAW,
                                      concurrency=args.concurrency)
    wall = time.perf_counter() - started
    decider.close()
    summaries = {name: summarize(group) for name, group in outcomes.items()}
    from importlib.metadata import version

    changed = {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile)
               if f.name in ("repetition_penalty", "call_bias", "call_bias_without_evidence", "read_call_count",
                             "call_count_margin", "candidates")}
    changed = {name: value for name, value in changed.items() if value != getattr(EMBEDDED_PROFILE, name)} or "defaults"
    meta = {"bfcl_version": version("bfcl-eval"), "model": Path(str(decider.tokenizer.name_or_path)).name,
            "seed": args.seed, "rows": None if args.all else args.rows, "profile": changed, "wall_s": wall,
            "command": "python -m bench.bfcl " + " ".join(sys.argv[1:])}
    for source, key in ((args.raw_from, "raw_command"), (args.toolrail_from, "toolrail_command")):
        if source is not None:
            meta[key] = json.loads(source.read_text("utf-8"))["meta"]["command"]
            meta["profile"] = json.loads(source.read_text("utf-8"))["meta"]["profile"] if key == "toolrail_command" \
                else meta["profile"]
    report = markdown(summaries, meta=meta)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, "utf-8")
    if args.details:  # per-row outputs hold values from the rows: keep them out of the repository
        args.details.write_text(json.dumps({"meta": meta, "summary": summaries, "rows": {
            name: [dataclasses.asdict(o) for o in group] for name, group in outcomes.items()}}, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="rows per category (seeded sample)")
    parser.add_argument("--all", action="store_true", help="every row of each category")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="sample seed (tune on one, report another)")
    parser.add_argument("--categories", default="", help=f"comma-separated subset of {','.join(CATEGORIES)}")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="override a field of the embedded profile (DeciderConfig), e.g. call_bias=0")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (the engine batches them)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--no-raw", action="store_true", help="skip the raw model")
    parser.add_argument("--no-toolrail", action="store_true", help="skip toolrail")
    parser.add_argument("--toolrail-from", type=Path, default=None,
                        help="take toolrail's outcomes from this --details file of the same seed and rows")
    parser.add_argument("--raw-from", type=Path, default=None,
                        help="take the raw model's outcomes from this --details file of the same seed and rows")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--details", type=Path, default=None, help="per-row JSON (outside the repository)")
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
