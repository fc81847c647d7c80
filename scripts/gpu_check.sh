#!/usr/bin/env bash
# First run of the production path on a GPU host, from the Triton image alone (< 10 min on an H200):
#
#   bash scripts/gpu_check.sh              # builds docker/Dockerfile.triton (TRITON_IMAGE=<tag> to use one
#                                          # already built or the pinned NGC tag) and runs --inside in it
#   bash scripts/gpu_check.sh --inside     # already inside the image (what the first form runs)
#   GPU_CHECK_DRY_RUN=1 OUT=/tmp/o bash scripts/gpu_check.sh --inside
#                                          # no GPU: nvidia-smi, tensorrt_llm, trtllm-build and tritonserver
#                                          # stubbed; everything else runs (tests/engine_build/test_gpu_check.py)
#
# Inside the image: toolrail is installed from the source tree into a virtualenv over the image's
# packages (its TensorRT-LLM, torch and transformers 4.x stay; WHEELHOUSE=<dir> installs offline:
# `pip download` there toolrail's dependencies, setuptools, wheel and moto[server] for the image's Python;
# a moto 5.x the image already has serves the local S3 too: the double needs no MotoRequestHandler);
# the model is GPU_CHECK_MODEL (an HF dir, e.g. the SmolLM2 export of `toolrail engine export-hf4`)
# or a tiny random llama made here (the grammar forces the probe's answers, so it needs no weights
# worth the name). Then, for each flavour - pytorch (LLM API), then engine (trtllm-build, the
# image's /app/all_models) - the cloud path end to end:
#
#   toolrail engine build → triton-repo (publish layout) → publish to a local S3 (moto, region
#   eu-west-1, refusing region-less clients) → the image's entrypoint downloads and verifies it →
#   tritonserver → scripts/triton_probe.py with the decider's client: 1 and 16 concurrent guided
#   decisions, a length stop, a call forced in the Qwen/Hermes format (its constraint as ebnf_grammar),
#   a client hang-up, the stream's final response; the task's peak RSS against the task_memory_mib
#   publish computed.
#
# Every step has a time limit that never passes the deadline; a failed step is recorded and the next
# still runs. Results: $OUT/summary.json (one JSON object), probe_*.json, logs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu_check_out}"
DRY_RUN="${GPU_CHECK_DRY_RUN:-0}"
REGION=eu-west-1
S3_PORT="${S3_PORT:-5900}"

if [ "${1:-}" != "--inside" ]; then
  IMAGE="${TRITON_IMAGE:-toolrail-triton:gpu-check}"
  if [ -z "${TRITON_IMAGE:-}" ]; then
    docker build -f "$ROOT/docker/Dockerfile.triton" -t "$IMAGE" "$ROOT" || exit 1
  fi
  mkdir -p "$OUT"
  exec docker run --rm --gpus all --shm-size=2g --user root --entrypoint bash \
    -v "$ROOT":/src:ro -v "$OUT":/out -e OUT=/out -e WHEELHOUSE="${WHEELHOUSE:-}" \
    -e GPU_CHECK_MODEL="${GPU_CHECK_MODEL:-}" -e BUDGET_S="${BUDGET_S:-570}" \
    "$IMAGE" /src/scripts/gpu_check.sh --inside
fi

mkdir -p "$OUT"
BUDGET_S="${BUDGET_S:-570}"
DEADLINE=$((SECONDS + BUDGET_S))
STEPS="$OUT/steps.jsonl"
: > "$STEPS"
SERVER_PID=""
S3_PID=""
SYSPY="${SYSPY:-python3}"
ENTRYPOINT="${GPU_CHECK_ENTRYPOINT:-/opt/toolrail/entrypoint.py}"
[ -f "$ENTRYPOINT" ] || ENTRYPOINT="$ROOT/docker/triton/entrypoint.py"  # the plain NGC image has no entrypoint
ALL_MODELS="${ALL_MODELS:-/app/all_models/inflight_batcher_llm}"
VENV="${GPU_CHECK_VENV:-/tmp/toolrail-venv}"
TPY="$VENV/bin/python"
# Where the entrypoint puts builds; the repositories' server paths are generated for it.
ENGINE_ROOT="${GPU_CHECK_ENGINE_ROOT:-/engines}"
[ "$DRY_RUN" = 1 ] && ENGINE_ROOT="$OUT/host"
export AWS_ACCESS_KEY_ID=gpu-check AWS_SECRET_ACCESS_KEY=gpu-check AWS_REGION="$REGION"
export AWS_ENDPOINT_URL_S3="http://127.0.0.1:$S3_PORT"

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
gpu_step() {  # gpu_step NAME LIMIT_S CMD...: a step only a GPU can run; recorded as stubbed in a dry run
  if [ "$DRY_RUN" = 1 ]; then record "$1" 0 0 "dry run: not run"; return 0; fi
  step "$@"
}
last_dir() { local found=""; for dir in "$@"; do [ -d "$dir" ] && found="$dir"; done; echo "$found"; }
stop_server() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=""; fi
}
finish() {
  stop_server
  [ -n "$S3_PID" ] && kill "$S3_PID" 2>/dev/null
  "$SYSPY" - "$STEPS" "$OUT" "$DRY_RUN" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[2])
steps = [json.loads(line) for line in pathlib.Path(sys.argv[1]).read_text().splitlines() if line.strip()]
probes = {p.stem: json.loads(p.read_text()) for p in out.glob("probe_*.json")}
memory = {p.stem.removeprefix("memory_"): json.loads(p.read_text()) for p in out.glob("memory_*.json")}
summary = {"ok": bool(steps) and all(s["ok"] for s in steps), "dry_run": sys.argv[3] == "1", "steps": steps,
           "probes": {name: {"ok": r.get("ok"), **{k: v.get("ok") for k, v in r.get("checks", {}).items()}}
                      for name, r in probes.items()},
           "memory": memory}
versions = out / "versions.json"
if versions.is_file():
    summary["versions"] = json.loads(versions.read_text())
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps({"ok": summary["ok"], "probes": summary["probes"], "memory": memory}))
PYEOF
}
trap finish EXIT

# ---- 0. a dry run stubs what needs the GPU (and nothing else)
if [ "$DRY_RUN" = 1 ]; then
  STUBS="$OUT/stubs"
  mkdir -p "$STUBS/bin" "$STUBS/py/tensorrt_llm" "$STUBS/py/tensorrt_llm-1.0.0.dist-info"
  cat > "$STUBS/bin/nvidia-smi" <<'SHEOF'
#!/bin/sh
case "$*" in
  *--query-gpu=compute_cap*) echo "9.0" ;;
  *--query-gpu=name,compute_cap*) echo "NVIDIA H200, 9.0" ;;
  *--query-gpu=name*) echo "NVIDIA H200" ;;
  *) echo "NVIDIA H200, 9.0, 143771 MiB, 570.00" ;;
esac
SHEOF
  printf '#!/bin/sh\necho "$@" > "%s/tritonserver.argv"\n' "$OUT" > "$STUBS/bin/tritonserver"
  # shellcheck disable=SC2016  # the stub's own variables
  printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --output_dir ] && o=$2; shift; done\nmkdir -p "$o" && echo stub > "$o/rank0.engine" && echo "{}" > "$o/config.json"\n' \
    > "$STUBS/bin/trtllm-build"
  chmod +x "$STUBS/bin/"*
  printf 'Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.0.0\n' > "$STUBS/py/tensorrt_llm-1.0.0.dist-info/METADATA"
  : > "$STUBS/py/tensorrt_llm/__init__.py"
  export PATH="$STUBS/bin:$PATH" PYTHONPATH="$STUBS/py${PYTHONPATH:+:$PYTHONPATH}"
fi

# ---- 1. versions, and toolrail installed inside the image
step versions 60 "$SYSPY" -c '
import importlib.metadata as md, json, pathlib, subprocess, sys
out = {"gpu": subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()}
version_file = pathlib.Path("/opt/tritonserver/TRITON_VERSION")
out["triton"] = version_file.read_text().strip() if version_file.exists() else None
for name in ("tensorrt_llm", "transformers", "xgrammar", "torch", "boto3"):
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
pathlib.Path(sys.argv[1]).write_text(json.dumps(out) + "\n")
print(json.dumps(out))' "$OUT/versions.json"
TRTLLM_VERSION="$("$SYSPY" -c 'import importlib.metadata as m; print(m.version("tensorrt_llm"))' 2>/dev/null)"
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | cut -d, -f1)"
if [ ! -x "$TPY" ]; then
  SRC="$OUT/src"
  rm -rf "$SRC" && mkdir -p "$SRC"
  for part in pyproject.toml README.md toolrail tools decider executor engine_build mcpbridge; do cp -r "$ROOT/$part" "$SRC/"; done
  INDEX=()
  [ -n "${WHEELHOUSE:-}" ] && INDEX=(--no-index --find-links "$WHEELHOUSE")
  # shellcheck disable=SC2016  # arguments of the inner shell
  step install-toolrail 240 bash -c '"$1" -m venv --system-site-packages "$2" && "$2/bin/pip" install -q "${@:4}" "$3" "moto[server]>=5.2,<6"' \
    _ "$SYSPY" "$VENV" "$SRC" "${INDEX[@]}"
fi
TOOLRAIL=("$TPY" -m toolrail.cli)  # an array, not a function: `timeout` runs it
ENTRY_PY="$SYSPY"  # the image's python runs the entrypoint; the plain NGC image has no boto3 there
"$SYSPY" -c 'import boto3' 2>/dev/null || ENTRY_PY="$TPY"

# ---- 2. the model, and a local S3 in another region than us-east-1
MODEL="${GPU_CHECK_MODEL:-$OUT/tiny-llama}"
if [ -z "${GPU_CHECK_MODEL:-}" ]; then
  step tiny-model 120 "$SYSPY" - "$MODEL" <<'PYEOF'
import sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
corpus = ['{"marker": "m00a"} Reply with JSON. Write a very long story about the sea.'] * 50
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>")
tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, torch_dtype="bfloat16")
torch.manual_seed(0)
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)
tokenizer.save_pretrained(sys.argv[1])
print(sys.argv[1], len(tokenizer))
PYEOF
fi
"$TPY" -m engine_build.s3_double --region "$REGION" --port "$S3_PORT" > "$OUT/s3.log" 2>&1 &
S3_PID=$!
step s3-bucket 30 "$TPY" -c '
import sys, time, boto3
s3 = boto3.client("s3", region_name=sys.argv[1])
for _ in range(60):
    try:
        s3.create_bucket(Bucket="gpu-check", CreateBucketConfiguration={"LocationConstraint": sys.argv[1]}); break
    except Exception as exc:
        last = exc; time.sleep(0.5)
else:
    raise SystemExit(f"no local S3: {last}")' "$REGION"

BUILD_ARGS=(--model "$MODEL" --gpu "$GPU_NAME" --trtllm-version "$TRTLLM_VERSION" --output-root "$OUT/engines"
            --python "$SYSPY" --max-batch-size 16 --max-input-len 1024 --max-seq-len 1536 --max-num-tokens 4096)

serve_and_probe() {  # serve_and_probe FLAVOUR ENTRY_MODEL BUILD_DIR: publish → entrypoint → tritonserver → probe
  local flavour="$1" entry="$2" build="$3"
  step "publish-$flavour" 120 "${TOOLRAIL[@]}" engine publish --build-dir "$build" --to s3://gpu-check/engines \
    --engine-root "$ENGINE_ROOT" --tfvars "$OUT/engine-$flavour.auto.tfvars.json" || return 1
  local key; key="$("$SYSPY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["engine"]["build_key"])' "$OUT/engine-$flavour.auto.tfvars.json")"
  TOOLRAIL_ENGINE_MANIFEST_URI="s3://gpu-check/engines/$key/manifest.json" TOOLRAIL_ENGINE_DIR="$ENGINE_ROOT" \
    TOOLRAIL_EXPECTED_TRTLLM_VERSION="$TRTLLM_VERSION" "$ENTRY_PY" "$ENTRYPOINT" > "$OUT/$flavour.server.log" 2>&1 &
  SERVER_PID=$!
  if [ "$DRY_RUN" = 1 ]; then
    wait "$SERVER_PID"; local rc=$?; SERVER_PID=""
    mv "$OUT/tritonserver.argv" "$OUT/$flavour.tritonserver.argv" 2>/dev/null
    record "entrypoint-$flavour" "$rc" 0 "downloaded, verified, exec'd tritonserver: $flavour.tritonserver.argv"
  fi
  gpu_step "ready-$flavour" 300 "$SYSPY" -c '
import time, urllib.request
for _ in range(600):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=2); print("ready"); break
    except Exception:
        time.sleep(0.5)
else:
    raise SystemExit("not ready")' || { stop_server; return 1; }
  # shellcheck disable=SC2016  # arguments of the inner shell
  gpu_step "probe-$flavour" 240 bash -c '
"$1" "$2" "$3" "$4" & sampler=$!
"$5" "$6/scripts/triton_probe.py" --model "$7" --tokenizer "$8" --out "$9"; rc=$?
kill $sampler; wait $sampler 2>/dev/null; exit $rc' _ "$SYSPY" "$OUT/rss_sampler.py" "$SERVER_PID" "$OUT/rss_$flavour.txt" \
    "$TPY" "$ROOT" "$entry" "$MODEL" "$OUT/probe_$flavour.json"
  "$SYSPY" -c 'import json, pathlib, sys
planned = json.load(open(sys.argv[1]))["engine"]["task_memory_mib"]
rss = pathlib.Path(sys.argv[2])
peak = int(rss.read_text()) if rss.is_file() else None
json.dump({"planned_mib": planned, "measured_peak_mib": peak, "within": None if peak is None else peak <= planned},
          open(sys.argv[3], "w"))' "$OUT/engine-$flavour.auto.tfvars.json" "$OUT/rss_$flavour.txt" "$OUT/memory_$flavour.json"
  stop_server
}

# The peak RSS of the server's process tree (tritonserver, Python model stubs, executor workers).
cat > "$OUT/rss_sampler.py" <<'PYEOF'
import pathlib, sys, time
root, out, peak = int(sys.argv[1]), pathlib.Path(sys.argv[2]), 0
while True:
    parents = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = (int(fields[1]), int(fields[21]) * 4096)
        except (OSError, IndexError, ValueError):
            pass
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _) in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid); grew = True
    peak = max(peak, sum(parents.get(pid, (0, 0))[1] for pid in tree) >> 20)
    out.write_text(f"{peak}\n")
    time.sleep(1)
PYEOF

# ---- 3. pytorch flavour (LLM API): the default cloud flavour
step build-pytorch 120 "${TOOLRAIL[@]}" engine build --backend pytorch "${BUILD_ARGS[@]}"
PT_BUILD="$(last_dir "$OUT"/engines/*-pytorch-*)"
if [ -n "$PT_BUILD" ]; then
  read -r -a LAYOUT <<< "$("${TOOLRAIL[@]}" engine publish --build-dir "$PT_BUILD" --print-layout --engine-root "$ENGINE_ROOT")"
  step repo-pytorch 120 "${TOOLRAIL[@]}" engine triton-repo --build-dir "$PT_BUILD" --output "$PT_BUILD/triton_repo" "${LAYOUT[@]}" \
    && serve_and_probe pytorch llmapi "$PT_BUILD"
fi

# ---- 4. engine flavour: trtllm-build, the image's own Triton model code
if [ "$(left)" -gt 200 ]; then
  SRC_TRTLLM="${TRTLLM_SRC:-$OUT/trtllm_src}"
  CONVERT="$SRC_TRTLLM/examples/models/core/llama/convert_checkpoint.py"
  mkdir -p "$(dirname "$CONVERT")"
  if [ "$DRY_RUN" = 1 ]; then
    printf 'import sys\nout = sys.argv[sys.argv.index("--output_dir") + 1]\nimport os; os.makedirs(out, exist_ok=True)\n' > "$CONVERT"
  elif [ ! -f "$CONVERT" ]; then  # the image ships no examples/: the same conversion through tensorrt_llm's model API
    cat > "$CONVERT" <<'PYEOF'
import argparse
p = argparse.ArgumentParser()
for flag in ("--model_dir", "--output_dir", "--dtype"):
    p.add_argument(flag, required=True)
p.add_argument("--tp_size", type=int, default=1)
p.add_argument("--pp_size", type=int, default=1)
a = p.parse_args()
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models import LLaMAForCausalLM
mapping = Mapping(world_size=a.tp_size * a.pp_size, tp_size=a.tp_size, pp_size=a.pp_size)
LLaMAForCausalLM.from_hugging_face(a.model_dir, dtype=a.dtype, mapping=mapping).save_checkpoint(a.output_dir, save_config=True)
PYEOF
  fi
  step build-engine 240 "${TOOLRAIL[@]}" engine build --backend engine --trtllm-src "$SRC_TRTLLM" "${BUILD_ARGS[@]}"
  EN_BUILD="$(last_dir "$OUT"/engines/*-engine-*)"
  if [ -n "$EN_BUILD" ]; then
    read -r -a LAYOUT <<< "$("${TOOLRAIL[@]}" engine publish --build-dir "$EN_BUILD" --print-layout --engine-root "$ENGINE_ROOT")"
    step repo-engine 60 "${TOOLRAIL[@]}" engine triton-repo --build-dir "$EN_BUILD" --output "$EN_BUILD/triton_repo" \
      --model-code-from "$ALL_MODELS" "${LAYOUT[@]}" && serve_and_probe engine tensorrt_llm_bls "$EN_BUILD"
  fi
else
  record engine-flavour 124 0 "skipped: less than 200 s left"
fi
