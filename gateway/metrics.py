"""Prometheus metrics (own registry, so tests and several apps in one process never collide)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

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
