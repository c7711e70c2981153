"""Image classify (EfficientNet-Lite0): decode + preprocess + classify through the gateway vs in process, at
concurrency 1/8/32, and the gateway's peak RSS for one 16 MiB upload.

The in-process side does the whole job without HTTP, JSON, base64 or gRPC: the gateway's own decoding pool and
preprocessing (gateway/images), one batched forward across concurrent callers (Triton's policy) on the engine and
precision Triton serves the model with (sr_backend.engines.load_configured), and the softmax readout. Photos are
scikit-image's samples (PNG, 0.1-0.5 MP), sent as base64 data URLs.

    .venv/bin/python -m tools.bench_images [--requests 100] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gateway.heads import softmax
from gateway.images.decode import decode_async
from gateway.images.preprocess import efficientnet_lite
from sr_build.tune_samples import sample_photos
from tools.benchlib import (
    ROOT,
    InProcessBatcher,
    free_port,
    gateway,
    gateway_cells,
    inprocess_load,
    render_comparison,
    served_baseline,
)
from tools.docs import replace_section

MODEL = "efficientnet-lite0"
MIB = 1024 * 1024


def vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def big_png() -> bytes:
    """Noise (incompressible) PNG just under 16 MiB: a real 16 MiB picture, 5.5 MP."""
    rng = np.random.default_rng(7)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, size=(2360, 2360, 3), dtype=np.uint8)).save(out, format="PNG",
                                                                                      compress_level=1)
    data = out.getvalue()
    assert len(data) <= 16 * MIB, len(data)
    return data


def upload_rss(url: str, pid: int) -> str:
    data = big_png()
    boundary = "bench-7f3a"
    request = {"model": MODEL, "input": ["A"], "assets": {"A": {"type": "image", "part": "a"}}}
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="request"\r\n\r\n{json.dumps(request)}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="a"\r\n\r\n').encode() + data + \
        f"\r\n--{boundary}--\r\n".encode()
    before_rss, before_peak = vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM")
    started = time.perf_counter()
    req = urllib.request.Request(url + "/v1/embeddings", data=body,
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        ok = r.status == 200 and "embedding" in json.loads(r.read())["data"][0]
    took = time.perf_counter() - started
    after_peak, after_rss = vm_kib(pid, "VmHWM"), vm_kib(pid, "VmRSS")
    return (f"One {len(data) / MIB:.2f} MiB PNG (2,360 × 2,360 noise, read at 1.6 MP) as a multipart part: answered "
            f"{'200' if ok else 'NOT OK'} in {took:.2f} s; gateway RSS {before_rss / 1024:.0f} → "
            f"{after_rss / 1024:.0f} MiB, peak (VmHWM) {before_peak / 1024:.0f} → {after_peak / 1024:.0f} MiB "
            f"(+{(after_peak - before_peak) / 1024:.0f} MiB).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100, help="requests per cell")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    images = sample_photos()  # the tuner's verification photos (scikit-image's samples)
    urls = [f"data:image/png;base64,{base64.b64encode(d).decode('ascii')}" for d in images]
    baseline = served_baseline(MODEL)  # the served engine and precision (its first output: logits)
    print(f"in-process baseline: {baseline.describe()}", flush=True)

    def run(rows: list[np.ndarray]) -> tuple[list[np.ndarray], None]:
        return list(baseline.engine.forward({"pixels": np.stack(rows)})), None

    async def work(batcher: InProcessBatcher, i: int) -> None:
        image = await decode_async(images[i % len(images)], 1_638_400)
        (logits,) = await batcher.submit([efficientnet_lite(image)])
        int(np.argmax(softmax(logits)))

    name = "classify a photo (PNG 0.1-0.5 MP)"
    rows: list[dict[str, Any]] = []
    for c in levels:
        r = asyncio.run(inprocess_load(InProcessBatcher(run, max_rows=32), work, c, args.requests))
        rows.append({"set": name, "c": c, "side": "in-process", **r.summary()})
        print(rows[-1], flush=True)
    grpc_port = free_port()
    with gateway(["--triton-grpc-port", str(grpc_port), "--models", MODEL, "--max-request-bytes",
                  str(20 * MIB)]) as (url, pid):
        rows += gateway_cells(url, pid, f"127.0.0.1:{grpc_port}", MODEL, "/v1/classify",
                              lambda i: {"model": MODEL, "input": [{"type": "image_url",
                                                                    "image_url": {"url": urls[i % len(urls)]}}]},
                              name, levels, args.requests)
        rss = upload_rss(url, pid)
    table = render_comparison(rows, baselines=[baseline], requests=args.requests,
                              note="Each request is one picture; the in-process side decodes on the gateway's pool.")
    text = f"{table}\n\n{rss}"
    print(text)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_images", text)


if __name__ == "__main__":
    main()
