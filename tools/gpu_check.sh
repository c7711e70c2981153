#!/bin/bash
# One prepared check for a machine with an NVIDIA GPU (run from the repository root, venv built):
#   1. the GPU;  2. `sr-gateway models build --target gpu` on a copy of the model repository (TensorRT plans,
#   fp16 where the golden check passes);  3. the gateway with its child Triton on that repository: ready means
#   every golden check passed;  4. the embeddings benchmark, batch 256 x 128 tokens;  5. achieved TFLOP/s against
#   the device's dense fp16/bf16 peak. Step 3 also requires Triton's output to show the model's instance running
#   on ONNX Runtime's TensorRT provider (sr_backend prints the session's providers; a missing one fails the load).
#
#   bash tools/gpu_check.sh          on the GPU machine
#   bash tools/gpu_check.sh --cpu    the same steps without a GPU (configs only, served on CPU): tests the script
# Env: MODEL (all-minilm-l6-v2), BATCHES (benchmark batches; 20, --cpu 2), PEAK_TFLOPS (else from the GPU name),
#      PYTHON (.venv/bin/python), WORK (a temp dir).
set -euo pipefail
CPU=0; [ "${1:-}" = "--cpu" ] && CPU=1
PYTHON=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PYTHON")
MODEL=${MODEL:-all-minilm-l6-v2}
BATCHES=${BATCHES:-$([ $CPU = 1 ] && echo 2 || echo 20)}
WORK=${WORK:-$(mktemp -d /tmp/sr-gpu-check.XXXXXX)}
GATEWAY_PID=""
cleanup() {
  if [ -n "$GATEWAY_PID" ] && kill -0 "$GATEWAY_PID" 2>/dev/null; then
    kill -TERM "$GATEWAY_PID"; wait "$GATEWAY_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "1. device"
if [ $CPU = 1 ]; then
  GPU_NAME="none (--cpu)"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  # the served path needs ONNX Runtime's TensorRT provider in this venv (onnxruntime-gpu + TensorRT's libraries in
  # place of the CPU onnxruntime wheel); say so before anything is built
  "$PYTHON" - <<'PY'
import sys
import onnxruntime as ort
providers = ort.get_available_providers()
print(f"onnxruntime {ort.__version__}: {providers}")
if "TensorrtExecutionProvider" not in providers:
    sys.exit("no TensorrtExecutionProvider: install onnxruntime-gpu and TensorRT (e.g. tensorrt-cu12) in this venv, "
             "in place of the CPU onnxruntime wheel")
PY
fi
echo "GPU: $GPU_NAME"

step "2. models build --target gpu (a copy of the repository in $WORK/repo)"
mkdir -p "$WORK/repo"
cp -rL model_repository/. "$WORK/repo/"
find "$WORK/repo" -name __pycache__ -prune -exec rm -rf {} +
if [ $CPU = 1 ]; then
  "$BIN/sr-gateway" models build --model-repository "$WORK/repo" --target gpu --configs-only
  grep -q 'kind: KIND_GPU' "$WORK/repo/$MODEL/config.pbtxt"
  grep -q 'trt_profile_max_shapes' "$WORK/repo/$MODEL/config.pbtxt"
  SERVE_REPO=model_repository  # KIND_GPU instances cannot load without a GPU: serve the CPU repository
else
  "$BIN/sr-gateway" models build --model-repository "$WORK/repo" --target gpu
  SERVE_REPO="$WORK/repo"
fi
cat "$WORK/repo/$MODEL/1/gpu.json"

step "3. gateway + Triton on $SERVE_REPO: ready = golden checks passed"
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$BIN/sr-gateway" serve --host 127.0.0.1 --port "$PORT" --model-repository "$SERVE_REPO" --models "$MODEL" \
  --max-queue 65536 >"$WORK/gateway.log" 2>&1 &
GATEWAY_PID=$!
"$PYTHON" - "$PORT" <<'PY'
import sys, time, httpx
url = f"http://127.0.0.1:{sys.argv[1]}/health"
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    try:
        body = httpx.get(url, timeout=2).json()
        if body["status"] in ("ready", "failed", "degraded"):
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
else:
    sys.exit("the gateway did not settle in 600 s")
print(body)
sys.exit(0 if body["status"] == "ready" else "a golden check failed")
PY
if [ $CPU = 1 ]; then
  echo "provider: CPU repository (--cpu), no GPU session to check"
else
  # the served instance's ONNX Runtime session, as sr_backend reports it: TensorRT must come first
  grep "sr_backend .*ONNX Runtime providers" "$WORK/gateway.log" || { echo "no provider line in $WORK/gateway.log"; exit 1; }
  grep -q "ONNX Runtime providers \['TensorrtExecutionProvider'" "$WORK/gateway.log" \
    || { echo "the model is not served by the TensorRT provider"; exit 1; }
fi

step "4-5. embeddings benchmark: $BATCHES batches of 256 x 128 tokens; TFLOP/s vs peak"
"$PYTHON" - "$PORT" "$SERVE_REPO/$MODEL" "$BATCHES" "$GPU_NAME" "${PEAK_TFLOPS:-}" <<'PY'
import json, sys, time
import httpx, yaml
from tokenizers import Tokenizer

port, model_dir, batches, gpu, peak_env = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
card = yaml.safe_load(open(f"{model_dir}/card.yaml"))
tok = Tokenizer.from_file(f"{model_dir}/1/tokenizer.json")
tok.no_truncation(); tok.no_padding()
words = " ".join(["token"] * 400)
ids = tok.encode(words).ids
text = tok.decode(ids[1:127])  # 126 word pieces + [CLS] + [SEP] = 128 tokens
assert len(tok.encode(text).ids) == 128, len(tok.encode(text).ids)
body = {"model": card["id"], "input": [text] * 256}
# MiniLM-L6 (BERT encoder): per token and layer 24 h^2 (QKV, output, 4h FFN: multiply-adds x 2) + 4 L h (scores)
H, LAYERS, L = 384, 6, 128
flops = 256 * L * LAYERS * (24 * H * H + 4 * L * H)
PEAKS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0, "T4": 65.0}
peak = float(peak_env) if peak_env else next((v for k, v in PEAKS.items() if k in gpu), None)
with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
    for _ in range(2):  # warm-up (the first batches may still build TensorRT contexts)
        r = client.post("/v1/embeddings", json=body)
        r.raise_for_status()
    assert r.json()["usage"]["prompt_tokens"] == 256 * 128, r.json()["usage"]
    start = time.perf_counter()
    for _ in range(batches):
        client.post("/v1/embeddings", json=body).raise_for_status()
    elapsed = time.perf_counter() - start
tflops = flops * batches / elapsed / 1e12
result = {"gpu": gpu, "model": card["id"], "batch": 256, "tokens": 128, "batches": batches,
          "seconds_per_batch": round(elapsed / batches, 4), "inputs_per_s": round(256 * batches / elapsed, 1),
          "gflop_per_batch": round(flops / 1e9, 1), "achieved_tflops": round(tflops, 3),
          "peak_dense_fp16_tflops": peak, "fraction_of_peak": round(tflops / peak, 5) if peak else None}
print(json.dumps(result, indent=2))
PY
