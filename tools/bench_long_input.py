"""Long inputs through /v1/embeddings: 5 MiB of English and 5 MiB of base64, under reject and truncate.

Measures the request's wall time and the gateway process's peak-RSS growth (VmHWM after − RSS before, with the
peak reset before each request), to show that
memory and time follow the token budget, not the input length. Targets: reject ≤ 0.3 s, truncate growth ≤ 100 MiB.

    .venv/bin/python -m tools.bench_long_input [--write]
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import time
import urllib.request
from pathlib import Path

from tools.benchlib import ROOT, gateway, machine
from tools.docs import replace_section

MODEL = "all-minilm-l6-v2"
SIZE = 5 * 1024 * 1024


def english(size: int) -> str:
    rng = random.Random(7)
    words = """the quick brown fox jumps over a lazy dog while the committee reviews quarterly plans and budgets
for the next fiscal year, noting that shipping delays, refund requests and password resets remain the most
frequent topics in support tickets.""".split()  # noqa: SIM905 (readable as prose)
    out: list[str] = []
    n = 0
    while n < size:
        sentence = " ".join(rng.choice(words) for _ in range(12)).capitalize() + ". "
        out.append(sentence)
        n += len(sentence)
    return "".join(out)[:size]


def b64(size: int) -> str:
    return base64.b64encode(random.Random(9).randbytes(size * 3 // 4)).decode()[:size]


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak(pid: int) -> float:
    """Reset the process's peak RSS to its current RSS (Linux: clear_refs 5) and return that RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_mib(pid, "VmRSS")


def post(url: str, body: bytes) -> tuple[float, dict[str, object]]:
    request = urllib.request.Request(url + "/v1/embeddings", data=body, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        answer = json.loads(r.read())
    return time.perf_counter() - started, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    texts = {"English 5 MiB": english(SIZE), "base64 5 MiB": b64(SIZE)}
    lines = [f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d')}. One request per row, to a gateway that "
             "served a short warm-up request first (tokenizer probed at load). RSS growth = the gateway process's "
             "peak RSS during the request (VmHWM, reset before each request) minus its RSS before it; the JSON body "
             "itself is 5 MiB.", "",
             "| input | overflow | wall s | peak RSS growth MiB | tokens reported | item |",
             "|---|---|---|---|---|---|"]
    with gateway(["--models", MODEL]) as (url, pid):
        post(url, json.dumps({"model": MODEL, "input": "warm up"}).encode())
        for name, text in texts.items():
            for overflow in ("reject", "truncate"):
                body = json.dumps({"model": MODEL, "input": text, "options": {"overflow": overflow}}).encode()
                before = reset_peak(pid)
                wall, answer = post(url, body)
                growth = status_mib(pid, "VmHWM") - before
                item = answer["data"][0]  # type: ignore[index]
                usage = item.get("input", {})
                outcome = item.get("error", "embedded")
                lines.append(f"| {name} | {overflow} | {wall:.3f} | {growth:.1f} | {usage.get('tokens', '–')}"
                             f"{' (lower bound)' if usage.get('tokens_lower_bound') else ''} | {outcome} |")
                print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", "bench_long_input", table)


if __name__ == "__main__":
    main()
