#!/usr/bin/env bash
# First run of the production path on a GPU host (< 10 min), inside NVIDIA's Triton image:
#
#   docker run --rm --gpus all --shm-size=2g -v "$PWD":/work -w /work -e OUT=/work/gpu_check_out \
#     nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3 bash scripts/gpu_check.sh
#
# toolrail runs from its own virtualenv ($TOOLRAIL_PY, default .venv/bin/python, made by `make
# install` on the host): its transformers 5 must not replace the image's transformers 4.x, which
# TensorRT-LLM and Triton's Python models use. Steps, each with its own time limit; a failed step
# is recorded and the next one still runs:
#
# 1. versions: GPU, driver, Triton, TensorRT-LLM, transformers and xgrammar in the image.
# 2. the SmolLM2 test model exported for transformers 4.x (`toolrail engine export-hf4`).
# 3. pytorch flavor: `toolrail engine triton-repo --flavor pytorch` served by a real tritonserver;
#    scripts/triton_probe.py: 1 then 16 concurrent guided requests validated against their own
#    schemas, a max_tokens=5 request that must say `length`, and a raw stream probe with the
#    empty-final opt-in off and on.
# 4. engine flavor, when time is left and $TRTLLM_SRC is a TensorRT-LLM checkout of the image's
#    version: build, `triton-repo` from its triton_backend/all_models, serve, the same probe on
#    tensorrt_llm_bls (there the final response must arrive only with the opt-in).
#
# Results: $OUT/summary.json (every step with ok/rc/seconds), probe_*.json, and logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
TPY="${TOOLRAIL_PY:-.venv/bin/python}"
SYSPY="${SYSPY:-python3}"
BUDGET_S="${BUDGET_S:-570}"
DEADLINE=$((SECONDS + BUDGET_S))
STEPS="$OUT/steps.jsonl"
: > "$STEPS"
SERVER_PID=""

left() { echo $((DEADLINE - SECONDS)); }
record() {  # record NAME RC SECONDS [DETAIL]
  "$SYSPY" -c 'import json,sys; print(json.dumps({"step": sys.argv[1], "ok": sys.argv[2] == "0", "rc": int(sys.argv[2]), "seconds": int(sys.argv[3]), "detail": sys.argv[4]}))' \
    "$1" "$2" "$3" "${4:-}" >> "$STEPS"
  echo "[$1] rc=$2 (${3}s) ${4:-}"
}
step() {  # step NAME LIMIT_S CMD...: run with a limit that never passes the deadline
  local name="$1" limit="$2"; shift 2
  local remaining; remaining=$(left)
  [ "$limit" -gt "$remaining" ] && limit="$remaining"
  if [ "$limit" -le 5 ]; then record "$name" 124 0 "skipped: out of time"; return 124; fi
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  record "$name" "$rc" $((SECONDS - start)) "log: $name.log"
  return "$rc"
}
stop_server() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=""; fi
}
serve() {  # serve NAME REPO: start tritonserver on REPO, wait for readiness
  local name="$1" repo="$2"
  tritonserver --model-repository="$repo" --grpc-port=8001 --http-port=8000 --metrics-port=8002 \
    --strict-readiness=true --exit-on-error=true --log-verbose=0 > "$OUT/$name.tritonserver.log" 2>&1 &
  SERVER_PID=$!
  step "$name-ready" 240 "$SYSPY" - <<'PYEOF'
import time, urllib.request
for _ in range(480):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=2)
        print("ready"); break
    except Exception:
        time.sleep(0.5)
else:
    raise SystemExit("not ready")
PYEOF
}
finish() {
  stop_server
  "$SYSPY" - "$STEPS" "$OUT/summary.json" <<'PYEOF'
import json, pathlib, sys
steps = [json.loads(line) for line in pathlib.Path(sys.argv[1]).read_text().splitlines() if line.strip()]
probes = {p.stem: json.loads(p.read_text()) for p in pathlib.Path(sys.argv[2]).parent.glob("probe_*.json")}
summary = {"ok": all(s["ok"] for s in steps), "steps": steps,
           "probes": {name: {"ok": r.get("ok"), **{k: v.get("ok") for k, v in r.get("checks", {}).items()}}
                      for name, r in probes.items()}}
pathlib.Path(sys.argv[2]).write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary["probes"]))
PYEOF
}
trap finish EXIT

# ---- 1. versions
step versions 60 "$SYSPY" - <<'PYEOF'
import importlib.metadata as md, json, pathlib, subprocess
out = {"gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()}
version_file = pathlib.Path("/opt/tritonserver/TRITON_VERSION")
out["triton"] = version_file.read_text().strip() if version_file.exists() else None
for name in ("tensorrt_llm", "transformers", "xgrammar", "tritonclient", "torch"):
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
PYEOF
cp "$OUT/versions.log" "$OUT/versions.json" 2>/dev/null
TRTLLM_VERSION="$("$SYSPY" -c 'import importlib.metadata as m; print(m.version("tensorrt_llm"))' 2>/dev/null)"
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

# ---- 2. the test model, for transformers 4.x
MODEL_DIR="$(timeout 300 "$TPY" -c 'from decider.model import resolve_model_path; print(resolve_model_path(None))' 2>"$OUT/model_pull.log" | tail -1)"
HF4="$OUT/smollm2-hf4"
step export-hf4 60 "$TPY" -m toolrail.cli engine export-hf4 --model "$MODEL_DIR" --output "$HF4"
step hf4-loads-in-image 60 "$SYSPY" -c "
from transformers import AutoConfig, AutoTokenizer
c = AutoConfig.from_pretrained('$HF4'); t = AutoTokenizer.from_pretrained('$HF4')
assert c.rope_theta == 100000.0, c.rope_theta
print(type(t).__name__, c.rope_theta)"

# ---- 3. pytorch flavor through a real tritonserver
step repo-pytorch 120 "$TPY" -m toolrail.cli engine triton-repo --flavor pytorch --model "$HF4" \
  --output "$OUT/repo_pytorch" --max-batch-size 16
if serve pytorch "$OUT/repo_pytorch"; then
  step probe-pytorch 240 "$TPY" scripts/triton_probe.py --model llmapi --tokenizer "$HF4" --out "$OUT/probe_pytorch.json"
fi
stop_server

# ---- 4. engine flavor, time permitting
if [ "$(left)" -gt 240 ] && [ -n "${TRTLLM_SRC:-}" ] && [ -d "$TRTLLM_SRC/triton_backend/all_models/inflight_batcher_llm" ]; then
  step engine-build 200 "$TPY" -m toolrail.cli engine build --backend engine --model "$HF4" --gpu "$GPU_NAME" \
    --trtllm-version "$TRTLLM_VERSION" --trtllm-src "$TRTLLM_SRC" --python "$SYSPY" --output-root "$OUT/engines" \
    --max-batch-size 16 --max-input-len 1024 --max-seq-len 1536 --max-num-tokens 4096
  BUILD_DIR="$(ls -d "$OUT"/engines/*-engine-* 2>/dev/null | tail -1)"
  if [ -n "$BUILD_DIR" ] && step repo-engine 60 "$TPY" -m toolrail.cli engine triton-repo --build-dir "$BUILD_DIR" \
      --model "$HF4" --output "$OUT/repo_engine" --max-batch-size 16 \
      --model-code-from "$TRTLLM_SRC/triton_backend/all_models/inflight_batcher_llm"; then
    if serve engine "$OUT/repo_engine"; then
      step probe-engine 120 "$TPY" scripts/triton_probe.py --model tensorrt_llm_bls --tokenizer "$HF4" \
        --out "$OUT/probe_engine.json"
    fi
    stop_server
  fi
else
  record engine-flavor 0 0 "skipped: needs TRTLLM_SRC (TensorRT-LLM $TRTLLM_VERSION checkout) and 240 s left"
fi
