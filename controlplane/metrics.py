"""Deployment metrics from Prometheus (or Thanos, same query API) for ``GET /deployments/{id}/metrics``.

Series select exactly the workload's own pods: the pods the apiserver lists for the workload's label
selector (the same one pods/logs/exec use), named one by one. Why not a name prefix: ``qwen-.*`` also
matches ``qwen-chat``'s pods, so two deployments' numbers would be summed.
Resource series use cAdvisor names; the vLLM block uses vLLM's own metric names and is only asked for
when the workload Service exists (before that there is nothing to scrape).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any

import aiohttp

from controlplane.errors import ApiError

RANGES = {"5m": 300, "15m": 900, "1h": 3600, "3h": 10800}
DEFAULT_RANGE = 1800
POINTS = 60
MIN_STEP = 15

log = logging.getLogger(__name__)


def prometheus_error(reason: str) -> ApiError:
    """502 with the kind of failure (the spec: "具体原因见 message"); the full detail goes to the log."""
    return ApiError(502, "prometheus_error", reason)


def _category(exc: BaseException) -> str:
    """What went wrong, in words that name no host, address or internal detail."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return "Certificate of the monitoring endpoint not trusted (TLS)"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "timed out"
    if isinstance(exc, aiohttp.ClientConnectionError):
        return "monitoring endpoint unreachable"
    if isinstance(exc, ValueError):
        return "unreadable answer"
    return "request failed"


def window(range_key: str | None) -> tuple[int, int]:
    """(range seconds, step seconds): about 60 points, never a step under 15 s."""
    seconds = RANGES.get(range_key or "", DEFAULT_RANGE)
    return seconds, max(MIN_STEP, seconds // POINTS)


def pod_matcher(pod_names: list[str]) -> str:
    """An exact-match alternation (PromQL regexes are anchored); dots in names are escaped."""
    return "|".join(sorted(name.replace(".", "\\\\.") for name in pod_names))


def queries(namespace: str, pod_names: list[str], step: int, vllm: bool) -> dict[str, str]:
    """PromQL per response field."""
    pods = f'namespace="{namespace}",pod=~"{pod_matcher(pod_names)}"'
    ctr = f'{pods},container!="",container!="POD"'
    rate_w = f"{max(4 * step, 60)}s"
    out = {
        "cpu": f"sum(rate(container_cpu_usage_seconds_total{{{ctr}}}[{rate_w}]))",
        "memory": f"sum(container_memory_working_set_bytes{{{ctr}}})",
        "netRx": f"sum(rate(container_network_receive_bytes_total{{{pods}}}[{rate_w}]))",
        "netTx": f"sum(rate(container_network_transmit_bytes_total{{{pods}}}[{rate_w}]))",
    }
    if vllm:
        for short, metric in (("ttft", "vllm:time_to_first_token_seconds"),
                              ("tpot", "vllm:time_per_output_token_seconds")):
            for q in (50, 95, 99):
                out[f"vllm.{short}P{q}"] = (
                    f"histogram_quantile(0.{q}, sum by (le) (rate({metric}_bucket{{{pods}}}[{rate_w}])))"
                )
            out[f"vllm.{short}Avg"] = (
                f"sum(rate({metric}_sum{{{pods}}}[{rate_w}])) / sum(rate({metric}_count{{{pods}}}[{rate_w}]))"
            )
        prompt = f"sum(rate(vllm:prompt_tokens_total{{{pods}}}[{rate_w}]))"
        generation = f"sum(rate(vllm:generation_tokens_total{{{pods}}}[{rate_w}]))"
        out["vllm.promptThroughput"] = prompt
        out["vllm.generationThroughput"] = generation
        out["vllm.totalThroughput"] = f"{prompt} + {generation}"
    return out


async def _range_query(
    http: aiohttp.ClientSession, base: str, query: str, start: float, end: float, step: int
) -> list[list[float]]:
    params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)}
    try:
        async with http.get(f"{base}/api/v1/query_range", params=params) as resp:
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        # The exception text names hosts, addresses and proxies: the log gets it, the caller a category.
        log.warning("Prometheus query failed: %s: %s", type(exc).__name__, exc)
        raise prometheus_error(f"Prometheus query failed: {_category(exc)}") from exc
    if not isinstance(body, dict) or body.get("status") != "success":
        kind = body.get("errorType") if isinstance(body, dict) else None
        log.warning("Prometheus query failed: HTTP %s %s: %s", resp.status, kind,
                    body.get("error") if isinstance(body, dict) else body)
        reason = f"HTTP {resp.status}" + (f" ({kind})" if isinstance(kind, str) and kind.isidentifier() else "")
        raise prometheus_error(f"Prometheus query failed: {reason}")
    result = body.get("data", {}).get("result") or []
    if not result:
        return []
    return [[float(ts), float(val)] for ts, val in result[0].get("values", [])]


async def collect(
    base_url: str, namespace: str, pod_names: list[str], range_key: str | None, vllm: bool,
    timeout_s: float = 10.0, tls: ssl.SSLContext | bool = True,
) -> dict[str, Any]:
    """Run every query in parallel and shape the response; the vLLM block is omitted when empty.
    Without pods there is nothing that could be ours: empty series, Prometheus not asked."""
    seconds, step = window(range_key)
    end = time.time()
    start = end - seconds
    qs = queries(namespace, pod_names, step, vllm)
    if not pod_names:
        series: list[list[list[float]]] = [[] for _ in qs]
    else:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s), connector=aiohttp.TCPConnector(ssl=tls)
        ) as http:
            series = await asyncio.gather(
                *(_range_query(http, base_url.rstrip("/"), q, start, end, step) for q in qs.values())
            )
    out: dict[str, Any] = {"stepSeconds": step}
    llm: dict[str, Any] = {}
    for key, values in zip(qs, series, strict=True):
        if key.startswith("vllm."):
            llm[key[5:]] = values
        else:
            out[key] = values
    if any(llm.values()):
        out["vllm"] = llm
    return out
