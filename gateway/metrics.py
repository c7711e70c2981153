"""Prometheus metrics (own registry, so tests and several apps in one process never collide)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .supervisor import STUB  # the Python backend runs each model instance as its own process of this name
from .timing import PHASES, Timing

_LATENCY = tuple(0.001 * 2**i for i in range(13))  # 1 ms … 4.1 s
_ROWS = tuple(2**i for i in range(9))  # 1 … 256
_TOKENS = tuple(64 * 2**i for i in range(13))  # 64 … 262,144


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sr_gateway_requests_total", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.request_seconds = Histogram("sr_gateway_request_duration_seconds", "Handler time (Server-Timing total)",
                                         ["endpoint"], buckets=_LATENCY, registry=r)
        self.phase_seconds = Histogram("sr_gateway_phase_duration_seconds", "Server-Timing phases",
                                       ["endpoint", "phase"], buckets=_LATENCY, registry=r)
        self.inputs = Counter("sr_gateway_inputs_total", "Inputs by model and outcome (ok or item error code)",
                              ["model", "outcome"], registry=r)
        self.input_tokens = Counter("sr_gateway_input_tokens_total", "Tokens sent to models", ["model"], registry=r)
        self.batch_rows = Histogram("sr_gateway_batch_rows", "Rows per Triton execute() (seen by the gateway)",
                                    ["model"], buckets=_ROWS, registry=r)
        self.batch_tokens = Histogram("sr_gateway_batch_tokens", "Real tokens per Triton execute()",
                                      ["model"], buckets=_TOKENS, registry=r)
        self.queue_depth = Gauge("sr_gateway_queue_depth",
                                 "Inputs submitted to Triton and not yet answered, per Triton model", ["model"],
                                 registry=r)
        self.ready = Gauge("sr_gateway_ready", "1 when every model is ready", registry=r)
        self.model_ready = Gauge("sr_gateway_model_ready", "1 when the model is ready", ["model"], registry=r)
        self.model_info = Gauge("sr_gateway_model_info", "Served model identity (value 1)",
                                ["model", "revision", "family", "engine", "device", "numerics"], registry=r)
        self.triton_restarts = Counter("sr_gateway_triton_restarts_total",
                                       "Restarts of the child tritonserver after it exited", registry=r)
        self.triton_last_exit = Gauge("sr_gateway_triton_last_exit_info",
                                      "Why tritonserver last exited (value 1; reason \"\" and 0 before any exit)",
                                      ["reason"], registry=r)
        self.max_queue = Gauge("sr_gateway_max_queue", "--max-queue: most inputs in flight per model",
                               registry=r)
        self.triton_up = Gauge("sr_gateway_triton_up", "1 while Triton answers its liveness check", registry=r)
        self.model_reloads = Counter("sr_gateway_model_reloads_total",
                                     "Models reloaded through Triton's repository API", ["model", "reason"],
                                     registry=r)

        self.result_cache = Counter("sr_gateway_result_cache_total",
                                    "Decision questions looked up in the result cache, by model and result (hit, miss)",
                                    ["model", "result"], registry=r)
        self._children: dict[tuple[object, ...], Any] = {}
        r.register(ProcessMemoryCollector())

    def child(self, metric: Any, *labels: str) -> Any:
        """The labelled child, cached: `labels()` validates and hashes on every call, a hot-path cost."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def count_input(self, model: str, outcome: str) -> None:
        """One answered input of `model`: "ok" or its item error code."""
        self.child(self.inputs, model, outcome).inc()

    def observe_request(self, endpoint: str, status: int, timing: Timing) -> None:
        self.child(self.requests, endpoint, str(status)).inc()
        if timing.total_ms is not None:
            self.child(self.request_seconds, endpoint).observe(timing.total_ms / 1000.0)
        for phase in PHASES:
            self.child(self.phase_seconds, endpoint, phase).observe(timing.ms[phase] / 1000.0)

    def triton_exited(self, reason: str) -> None:
        self.triton_last_exit.clear()
        self.triton_last_exit.labels(reason).set(1)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# -- memory of the served process tree --------------------------------------------------------------------------------
INSTANCE_GAUGE = "sr_gateway_model_instance_resident_bytes"  # the same name as the instances' own (triton_model.py)
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    role: str  # "gateway" (the root), "tritonserver", "model" (a Python-backend instance) or "other"
    model: str  # model instances: the Triton model; else ""
    instance: str  # model instances: Triton's instance name (e.g. all-minilm-l6-v2_0_0); else the command name
    rss_bytes: int


def _stat(pid: str) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.index("(") + 1:text.rindex(")")], int(text[text.rindex(")") + 2:].split()[1])


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _describe(pid: int, name: str) -> tuple[str, str, str]:
    """(role, model, instance) of one descendant, from its command line: the stub is started as
    `triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region> … <instance name> …`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        argv = []
    args = [a.decode(errors="replace") for a in argv if a]
    if args and Path(args[0]).name == STUB and len(args) > 1:
        model = Path(args[1]).parent.parent.name
        instance = next((a for a in args[2:] if a.startswith(model + "_")), f"pid{pid}")
        return "model", model, instance
    if name == "tritonserver" or (args and Path(args[0]).name == "tritonserver"):
        return "tritonserver", "", "tritonserver"
    return "other", "", name


def process_tree_memory(root: int | None = None) -> list[ProcessMemory]:
    """Resident memory of `root` (default: this process) and every descendant, read from /proc.

    Why /proc and not Triton: `sr-gateway serve` starts tritonserver as its child and every model instance is a
    grandchild, so the gateway can read their memory directly, at scrape time, without a metrics port or code in the
    models' hot path. Where Triton runs elsewhere (--triton-url, another container) there are no descendants and
    the gauge is absent; the container's own memory metrics cover that case (docs/design.md, engines)."""
    root = os.getpid() if root is None else root
    parents: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _stat(entry)) is not None:
            parents[int(entry)] = found
    tree, frontier = {root}, [root]
    children: dict[int, list[int]] = {}
    for pid, (_, parent) in parents.items():
        children.setdefault(parent, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in tree:
                tree.add(child)
                frontier.append(child)
    out = []
    for pid in sorted(tree):
        name = parents.get(pid, ("", 0))[0]
        role, model, instance = ("gateway", "", name) if pid == root else _describe(pid, name)
        out.append(ProcessMemory(pid, role, model, instance, _rss(pid)))
    return out


class ProcessMemoryCollector(Collector):
    """`sr_gateway_model_instance_resident_bytes{model,instance}` and `sr_gateway_tritonserver_resident_bytes`,
    read at scrape time: per-instance memory is what a pod's limit must hold (issue 23: ragged shapes grew
    instances by GBs). Where Triton is not this process's child (the k8s pod: its own container), each model
    instance sets the same instance gauge on Triton's metrics endpoint (sr_backend/triton_model.py), so one
    dashboard query reads both deployments."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        instances = GaugeMetricFamily(INSTANCE_GAUGE,
                                      "Resident memory of each Python-backend model instance (a child of Triton)",
                                      labels=["model", "instance"])
        triton = GaugeMetricFamily("sr_gateway_tritonserver_resident_bytes",
                                   "Resident memory of the child tritonserver (without its model instances)")
        for proc in process_tree_memory():
            if proc.role == "model":
                instances.add_metric([proc.model, proc.instance], proc.rss_bytes)
            elif proc.role == "tritonserver":
                triton.add_metric([], proc.rss_bytes)
        yield instances
        yield triton
