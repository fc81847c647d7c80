"""Embedded decider engine: constraint cost, batching gain, mask engines, request mixing.

Measured side by side in one run on the same machine and model (SmolLM2-135M-Instruct):

(a) unconstrained vs JSON-Schema-constrained decode tokens/s at B=1 and B=16
    (target: the constraint costs <= 5 %);
(b) B=16 vs B=1 throughput (target >= 6x);
(c) per-token mask fill time of xgrammar, llguidance and outlines-core on the same schema and
    tokenizer, walking the same valid tokenisation;
(d) the published mixing reproduction: batches of 4/8/16/32 concurrent requests, each asking
    for two parallel calls (query_balance + transfer) on accounts unique to that request, one
    shared schema (the model must copy its own accounts); a call carrying another request's
    account is a mixed call (target 0);
(e) with ``--dtypes``, only: the dtype modes loaded side by side, prefill of an uncached
    200-token prompt, decode ms/token at batch 1 and seconds per decision (the real decider,
    grammar and grounding included) on a handful of built-in prompts.

"decode tok/s" counts generated tokens over the wall time of decode steps only (forward,
grammar, sampling, streaming); "per CPU-s" divides by the process CPU seconds of those steps
instead (all threads), which other tenants of a shared machine do not distort; "e2e tok/s"
also includes prefill and queueing. Targets are judged on the CPU-time figures when the
machine is shared; run with ``--threads 1`` there.

Usage::

    python bench/decider.py [--device cpu|cuda] [--dtype bfloat16] [--quick] [--threads N]
    python bench/decider.py --dtypes float32,bfloat16,hybrid [--threads 1]   # (e) only

Results go to ``bench/out/decider-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from decider.backend import GenerationRequest  # noqa: E402
from decider.embedded import EmbeddedEngine  # noqa: E402

OUT_DIR = ROOT / "bench" / "out"

SYSTEM = ("You are a banking assistant. Reply only with a JSON list of tool calls. Tools: "
          "query_balance(account) returns the balance; transfer(from_account, to_account, amount) moves money.")

ACCOUNT = {"type": "string", "pattern": "^ACC-[0-9]{4}$"}
BALANCE_CALL = {
    "type": "object",
    "properties": {"name": {"const": "query_balance"},
                   "arguments": {"type": "object", "properties": {"account": ACCOUNT},
                                 "required": ["account"], "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False,
}
TRANSFER_CALL = {
    "type": "object",
    "properties": {"name": {"const": "transfer"},
                   "arguments": {"type": "object",
                                 "properties": {"from_account": ACCOUNT, "to_account": ACCOUNT,
                                                "amount": {"type": "integer", "minimum": 1, "maximum": 99999}},
                                 "required": ["from_account", "to_account", "amount"],
                                 "additionalProperties": False}},
    "required": ["name", "arguments"], "additionalProperties": False,
}
#: One schema shared by every request: two parallel calls, balance then transfer.
TWO_CALLS = {"type": "array", "prefixItems": [BALANCE_CALL, TRANSFER_CALL], "items": False,
             "minItems": 2, "maxItems": 2}
ACCOUNT_RE = re.compile(r"ACC-[0-9]{4}")


def chat(engine: EmbeddedEngine, user: str, system: str | None = SYSTEM) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def banking_prompt(engine: EmbeddedEngine, own: str, payee: str, amount: int) -> str:
    return chat(engine, f"Check the balance of {own} and transfer {amount} from {own} to {payee}.")


def run_batch(engine: EmbeddedEngine, requests: list[GenerationRequest]) -> tuple[list[tuple], dict[str, float]]:
    """Submit all at once from threads; returns outputs and engine-stat deltas."""
    before = dict(engine.stats)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
        outputs = list(pool.map(engine.generate_sync, requests))
    wall = time.perf_counter() - started
    delta = {key: engine.stats[key] - before.get(key, 0) for key in engine.stats}
    delta["wall_s"] = wall
    return outputs, delta


# ------------------------------------------------------------------------------------ (a) + (b)


def decode_speed(engine: EmbeddedEngine, *, batch: int, constrained: bool, reps: int, tokens: int) -> dict[str, Any]:
    runs = []
    # The same prompt on both sides, so sequence lengths (and attention cost) match; only the
    # grammar differs.
    prompt = chat(engine, "Write a long story about a dragon who counts coins.", system=None)
    schema = json.dumps(TWO_CALLS) if constrained else None
    for rep in range(reps):
        requests = [GenerationRequest(request_id=f"{'c' if constrained else 'u'}{batch}-{rep}-{i}", prompt=prompt,
                                      max_tokens=tokens, json_schema=schema) for i in range(batch)]
        outputs, delta = run_batch(engine, requests)
        generated = sum(out[2]["completion_tokens"] for out in outputs)
        # The first token of each request comes from its prefill; the rest from decode steps.
        runs.append({"decode_tok_s": delta["decode_tokens"] / delta["decode_s"] if delta["decode_s"] else 0.0,
                     "decode_tok_cpu_s": delta["decode_tokens"] / delta["decode_cpu_s"] if delta["decode_cpu_s"] else 0.0,
                     "e2e_tok_s": generated / delta["wall_s"],
                     "tokens_per_request": generated / batch,
                     "mask_rows_per_token": delta["mask_apply_rows"] / max(1, delta["decode_tokens"]),
                     # Grammar work on the decode critical path (waiting for the overlapped mask
                     # fill, masking rows, advancing matchers) as a share of decode wall time:
                     # a direct measure of the constraint's cost that machine noise cannot flip.
                     "grammar_share": (delta["grammar_wait_s"] + delta["mask_apply_s"] + delta["grammar_accept_s"])
                     / delta["decode_s"] if delta["decode_s"] else 0.0})
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


# ------------------------------------------------------------------------------------ (c)


def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the byte-level BPE alphabet back to raw bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes)}


def mask_engines(engine: EmbeddedEngine, schema: dict, instance: Any) -> dict[str, Any]:
    """Fill a mask before every token of one valid tokenisation, in each library."""
    schema_text = json.dumps(schema)
    text = json.dumps(instance, ensure_ascii=False)
    token_ids = engine.encode(text)
    eos = min(engine.eos_token_ids)
    vocab_size = engine.vocab_size
    results: dict[str, Any] = {"tokens": len(token_ids)}

    import xgrammar as xgr

    started = time.perf_counter()
    compiled = engine.compiler.compile_json_schema(schema_text, any_whitespace=False)
    compile_s = time.perf_counter() - started
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, engine.tokenizer_info.vocab_size)
    times, rejected = [], 0
    for token in token_ids + [eos]:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        times.append(time.perf_counter() - t0)
        if not matcher.accept_token(token):
            rejected += 1
            break
    results["xgrammar"] = {"mean_us": statistics.mean(times) * 1e6, "median_us": statistics.median(times) * 1e6,
                           "compile_s": compile_s, "rejected": rejected}

    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch as llg_torch

        started = time.perf_counter()
        ll_tokenizer = llguidance.hf.from_tokenizer(engine.tokenizer, n_vocab=vocab_size)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_text)
        ll_matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
        compile_s = time.perf_counter() - started
        ll_mask = llg_torch.allocate_token_bitmask(1, ll_tokenizer.vocab_size)
        times, rejected = [], 0
        for token in token_ids + [eos]:
            t0 = time.perf_counter()
            llg_torch.fill_next_token_bitmask(ll_matcher, ll_mask, 0)
            times.append(time.perf_counter() - t0)
            if not ll_matcher.consume_token(token):
                rejected += 1
                break
        results["llguidance"] = {"mean_us": statistics.mean(times) * 1e6, "median_us": statistics.median(times) * 1e6,
                                 "compile_s": compile_s, "rejected": rejected,
                                 "error": ll_matcher.get_error() or None}
    except Exception as exc:  # a missing optional library is reported, not fatal
        results["llguidance"] = {"error": repr(exc)}

    try:
        import outlines_core

        started = time.perf_counter()
        # Built by hand: Vocabulary.from_pretrained would try the hub.
        byte_decoder = _byte_decoder()
        special = set(engine.tokenizer.all_special_ids)
        entries: dict[bytes, list[int]] = {}
        for token, token_id in engine.tokenizer.get_vocab().items():
            if token_id == eos or token_id in special or token_id >= vocab_size:
                continue
            try:
                raw = bytes(byte_decoder[ch] for ch in token)
            except KeyError:
                raw = token.encode()
            entries.setdefault(raw, []).append(token_id)
        vocabulary = outlines_core.Vocabulary(eos, entries)
        regex = outlines_core.json_schema.build_regex_from_schema(schema_text)
        index = outlines_core.Index(regex, vocabulary)
        compile_s = time.perf_counter() - started
        guide = outlines_core.Guide(index)
        oc_mask = torch.zeros(1, (vocab_size + 31) // 32, dtype=torch.int32)
        times, rejected = [], 0
        for token in token_ids:
            t0 = time.perf_counter()
            guide.write_mask_into(oc_mask.data_ptr(), oc_mask.numel(), oc_mask.element_size())
            times.append(time.perf_counter() - t0)
            try:
                guide.advance(token)
            except Exception:
                rejected += 1
                break
        results["outlines-core"] = {"mean_us": statistics.mean(times) * 1e6,
                                    "median_us": statistics.median(times) * 1e6,
                                    "compile_s": compile_s, "rejected": rejected}
    except Exception as exc:
        results["outlines-core"] = {"error": repr(exc)}
    return results


# ------------------------------------------------------------------------------------ (d)


def mixing(engine: EmbeddedEngine, batch: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    numbers = rng.sample(range(1000, 10000), 2 * batch)
    plans = [{"own": f"ACC-{numbers[2 * i]}", "payee": f"ACC-{numbers[2 * i + 1]}", "amount": rng.randrange(10, 999)}
             for i in range(batch)]
    requests = [GenerationRequest(request_id=f"mix{batch}-{i}", prompt=banking_prompt(engine, **plan),
                                  json_schema=json.dumps(TWO_CALLS), max_tokens=160) for i, plan in enumerate(plans)]
    # Stagger arrivals so requests join a running batch at different steps.
    started = time.perf_counter()

    def submit(index: int) -> tuple:
        time.sleep(0.05 * index)
        return engine.generate_sync(requests[index])

    with concurrent.futures.ThreadPoolExecutor(max_workers=batch) as pool:
        outputs = list(pool.map(submit, range(batch)))
    wall = time.perf_counter() - started
    owners = {}
    for index, plan in enumerate(plans):
        owners[plan["own"]] = owners[plan["payee"]] = index
    calls = mixed = exact = valid = 0
    for index, (plan, (text, reason, _)) in enumerate(zip(plans, outputs)):
        try:
            parsed = json.loads(text, strict=False)
        except json.JSONDecodeError:
            parsed = []
        valid += reason == "stop" and len(parsed) == 2
        for call in parsed:
            calls += 1
            accounts = ACCOUNT_RE.findall(json.dumps(call["arguments"]))
            mixed += any(owners.get(account, index) != index for account in accounts)
        if len(parsed) == 2:
            exact += (parsed[0]["arguments"] == {"account": plan["own"]}
                      and parsed[1]["arguments"] == {"from_account": plan["own"], "to_account": plan["payee"],
                                                     "amount": plan["amount"]})
    return {"batch": batch, "calls": calls, "mixed": mixed, "valid_requests": valid, "exact_requests": exact,
            "wall_s": wall}


# ------------------------------------------------------------------------------------ (e)

#: Decisions timed per dtype mode: (tool set, user message).
DECISION_PROMPTS = (
    ("builtin", "What's the weather in Lisbon tomorrow, in celsius?"),
    ("builtin", "Move 120 from ACC-1042 to ACC-2210, then tell me what is left on ACC-1042."),
    ("builtin", "Thanks, that's all for today."),
    ("calendar", "Book the cedar room for 4 people on 2025-03-14 at 09:30 for 45 minutes."),
    ("orders", "Where is my order SO123456?"),
    ("orders", "Please refund 19.99 on order SO654321, the item arrived damaged."),
)
KERNEL_PROMPT_TOKENS = 200
KERNEL_DECODE_TOKENS = 30


def _kernel_prompt(engine: EmbeddedEngine, rep: int) -> str:
    """About ``KERNEL_PROMPT_TOKENS`` tokens that no earlier prompt shares a prefix block with."""
    filler = " ".join(f"coin {rep}-{i} fell into the dragon's hoard;" for i in range(KERNEL_PROMPT_TOKENS))
    return engine.tokenizer.decode(engine.encode(f"Run {rep}. Continue the story: {filler}")[:KERNEL_PROMPT_TOKENS])


def _kernel_speed(engine: EmbeddedEngine, rep: int) -> dict[str, float]:
    """Prefill of one uncached prompt and single-token decode steps at batch 1."""
    before = dict(engine.stats)
    engine.generate_sync(GenerationRequest(request_id=f"kernel-{rep}", prompt=_kernel_prompt(engine, rep),
                                           max_tokens=KERNEL_DECODE_TOKENS + 1))
    delta = {key: engine.stats[key] - before.get(key, 0) for key in engine.stats}
    return {"prefill_tokens": delta["prefill_tokens"], "prefill_s": delta["prefill_s"],
            "prefill_tok_s": delta["prefill_tokens"] / delta["prefill_s"],
            "decode_ms_token": 1000 * delta["decode_s"] / max(1, delta["decode_tokens"])}


def dtype_comparison(model: str | None, device: str | None, modes: list[str], *, reps: int) -> dict[str, Any]:
    """Every dtype mode loaded side by side; kernels and decisions alternate mode by mode.

    The order of the modes rotates every repetition, so drift in a shared machine's load hits
    all of them alike; medians over repetitions. "agree" counts decisions identical to those
    of the first mode.
    """
    from bench.toolsets import load_toolset
    from decider.protocol import DecideRequest
    from decider.service import EmbeddedDecider

    # "<dtype>:jf" / "<dtype>:nojf": the same dtype with jump-forward decoding on / off.
    engines = {mode: EmbeddedEngine.load(model, device=device, dtype=mode.partition(":")[0], max_batch_size=4,
                                         max_seq_len=1024,
                                         **({"jump_forward": mode.endswith(":jf")} if ":" in mode else {}))
               for mode in modes}
    deciders = {mode: EmbeddedDecider.from_engine(engine) for mode, engine in engines.items()}
    requests = [DecideRequest(request_id=f"dtype-{i}", messages=[{"role": "user", "content": text}],
                              tools=load_toolset(toolset)) for i, (toolset, text) in enumerate(DECISION_PROMPTS)]
    for mode in modes:  # warm-up: kernels, grammars and the shared-prefix cache of every tool set
        for request in requests:
            deciders[mode].decide(request)
    kernels: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    calls: dict[str, list[str]] = {mode: [] for mode in modes}
    for rep in range(reps):
        order = modes[rep % len(modes):] + modes[: rep % len(modes)]
        for mode in order:
            kernels[mode].append(_kernel_speed(engines[mode], rep))
        for request in requests:
            for mode in order:
                started = time.perf_counter()
                decision = deciders[mode].decide(request)
                seconds[mode].append(time.perf_counter() - started)
                calls[mode].append(json.dumps([call.model_dump() for call in decision.tool_calls], sort_keys=True))
    rows = {}
    for mode, engine in engines.items():
        row = {field: statistics.median(run[field] for run in kernels[mode]) for field in kernels[mode][0]}
        row["weights"] = str(engine.dtype).replace("torch.", "")
        row["decode_weights"] = str(engine.decode_dtype).replace("torch.", "")
        row["s_request"] = statistics.median(seconds[mode])
        row["agree"] = sum(a == b for a, b in zip(calls[mode], calls[modes[0]])) / len(calls[mode])
        rows[mode] = row
        engine.close()
    return {"reps": reps, "decisions_per_rep": len(requests), "modes": rows}


def print_dtype_table(report: dict[str, Any]) -> None:
    comparison = report["dtypes"]
    modes = comparison["modes"]
    first = next(iter(modes))
    print(f"\n(e) dtype modes on {report['device']} ({report['threads']} threads, bf16 native: {report['native_bf16']}), "
          f"medians of {comparison['reps']} alternating repetitions, {comparison['decisions_per_rep']} decisions each\n")
    print(f"| mode | weights (prefill / decode) | prefill s ({KERNEL_PROMPT_TOKENS} tok) | prefill tok/s "
          f"| decode ms/token | s/request | decisions as {first} |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode, row in modes.items():
        print(f"| {mode} | {row['weights']} / {row['decode_weights']} | {row['prefill_s']:.2f} | {row['prefill_tok_s']:.0f} "
              f"| {row['decode_ms_token']:.1f} | {row['s_request']:.2f} | {row['agree'] * 100:.0f} % |")


# ------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="auto (default), hybrid, bfloat16, float32, float16")
    parser.add_argument("--dtypes", default=None,
                        help="only compare these dtype modes side by side (e.g. float32,bfloat16,hybrid; "
                             "hybrid:jf / hybrid:nojf with jump-forward on / off): prefill, decode and s/decision")
    parser.add_argument("--model", default=None, help="local HF model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--quick", action="store_true", help="one repetition, mixing at batch 4 and 8 only")
    parser.add_argument("--batch-sizes", default="1,16", help="decode batch sizes for (a)/(b), comma separated; must include 1 and 16")
    parser.add_argument("--out", default=None, help="write the JSON report here (default bench/out/decider-<time>.json)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    reps = 1 if args.quick else 5
    if args.dtypes:
        from decider.engine_loading import native_bf16
        from toolrail.logging import configure_logging

        configure_logging(json=False, level="WARNING")  # the decider logs every decision at debug

        device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        report = {"device": str(device), "threads": torch.get_num_threads(), "native_bf16": native_bf16(device),
                  "dtypes": dtype_comparison(args.model, args.device, [m.strip() for m in args.dtypes.split(",")],
                                             reps=2 if args.quick else 5)}
        print_dtype_table(report)
        write_report(report, args.out, "decider-dtypes")
        return 0
    sizes = sorted({1, 16, *(int(b) for b in args.batch_sizes.split(",") if b.strip())})
    engine = EmbeddedEngine.load(args.model, device=args.device, dtype=args.dtype, max_batch_size=max(32, *sizes),
                                 max_seq_len=1024)
    dtype = str(engine.dtype).replace("torch.", "")
    if engine.decode_dtype != engine.dtype:
        dtype += "+" + str(engine.decode_dtype).replace("torch.", "") + " decode"
    report: dict[str, Any] = {"device": str(engine.device), "dtype": dtype,
                              "threads": torch.get_num_threads(), "model": str(engine.model_path)}
    # Warm up kernels and the prefix cache once.
    engine.generate_sync(GenerationRequest(request_id="warmup", prompt=chat(engine, "hi"), max_tokens=4))

    # Free and constrained runs alternate, repetition by repetition, so drift in a shared
    # machine's load hits both sides alike; medians over repetitions.
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(reps):
        for batch in sizes:
            for constrained in ((False, True) if rep % 2 == 0 else (True, False)):
                key = f"B{batch}_{'constrained' if constrained else 'free'}"
                runs.setdefault(key, []).append(
                    decode_speed(engine, batch=batch, constrained=constrained, reps=1, tokens=48))
    report["speed"] = {key: {field: statistics.median(run[field] for run in rows) for field in rows[0]}
                       for key, rows in runs.items()}

    instance = [{"name": "query_balance", "arguments": {"account": "ACC-1234"}},
                {"name": "transfer", "arguments": {"from_account": "ACC-1234", "to_account": "ACC-5678", "amount": 250}}]
    report["mask"] = mask_engines(engine, TWO_CALLS, instance)

    batches = (4, 8) if args.quick else (4, 8, 16, 32)
    report["mixing"] = [mixing(engine, batch, seed=batch) for batch in batches]
    engine.close()

    print_table(report)
    write_report(report, args.out, "decider")
    return 0


def write_report(report: dict[str, Any], out: str | None, prefix: str) -> None:
    """Write ``report`` as JSON to ``out`` (default: a timestamped file under ``bench/out``)."""
    path = Path(out) if out else OUT_DIR / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")


def print_table(report: dict[str, Any]) -> None:
    speed = report["speed"]
    print(f"\nembedded engine on {report['device']} ({report['dtype']}, {report['threads']} threads)\n")
    print("(a) constraint cost, 48 tokens/request, medians of alternating runs")
    print("                          decode tok/s   per CPU-s   e2e tok/s   masked rows/token")
    for batch in (1, 16):
        free, cons = speed[f"B{batch}_free"], speed[f"B{batch}_constrained"]
        for name, row in (("free", free), ("constrained", cons)):
            print(f"    B={batch:<3} {name:<12} {row['decode_tok_s']:>15.1f} {row['decode_tok_cpu_s']:>11.1f} "
                  f"{row['e2e_tok_s']:>11.1f} {row['mask_rows_per_token']:>19.2f}")
        wall_cost = 1 - cons["decode_tok_s"] / free["decode_tok_s"]
        cpu_cost = 1 - cons["decode_tok_cpu_s"] / free["decode_tok_cpu_s"]
        print(f"    B={batch:<3} constraint cost {wall_cost * 100:>11.1f} % {cpu_cost * 100:>9.1f} %"
              f"   grammar on critical path {cons['grammar_share'] * 100:.1f} % of step time   (target <= 5 %)")
    print("\n(b) batching gain, B=16 / B=1       wall    CPU time   (target >= 6x)")
    for name in ("free", "constrained"):
        wall = speed[f"B16_{name}"]["decode_tok_s"] / speed[f"B1_{name}"]["decode_tok_s"]
        cpu = speed[f"B16_{name}"]["decode_tok_cpu_s"] / speed[f"B1_{name}"]["decode_tok_cpu_s"]
        print(f"    {name:<28} {wall:>5.1f}x {cpu:>9.1f}x")
    mask = report["mask"]
    print(f"\n(c) mask fill per token, {mask['tokens']} tokens of a two-call tool schema, 49,152-token vocab")
    print("    engine          mean us   median us   setup s   rejected")
    base = mask["xgrammar"]["mean_us"]
    for name in ("xgrammar", "llguidance", "outlines-core"):
        row = mask.get(name, {})
        if "mean_us" not in row:
            print(f"    {name:<14} error: {row.get('error')}")
            continue
        print(f"    {name:<14} {row['mean_us']:>8.1f} {row['median_us']:>11.1f} {row['compile_s']:>9.2f} "
              f"{row['rejected']:>10}   ({row['mean_us'] / base:.1f}x xgrammar)")
    print("\n(d) mixing reproduction: two parallel calls per request, one shared schema")
    print("    batch   calls   mixed   valid req   exact req   wall s")
    for row in report["mixing"]:
        print(f"    {row['batch']:>5} {row['calls']:>7} {row['mixed']:>7} {row['valid_requests']:>11} "
              f"{row['exact_requests']:>11} {row['wall_s']:>8.1f}")
    total = sum(row["mixed"] for row in report["mixing"])
    print(f"    mixed calls in total: {total} (target 0)")


if __name__ == "__main__":
    sys.exit(main())
