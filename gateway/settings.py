"""One typed settings object. Every field is a CLI flag of `sr-gateway serve` and has an `SR_GATEWAY_*` env twin.

Precedence: flag > environment > default. The configuration table in README.md lists them.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ENV_PREFIX = "SR_GATEWAY_"
DEFAULT_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"


@dataclass(frozen=True)
class Settings:
    host: str = field(default="127.0.0.1", metadata={"help": "address the HTTP API binds to"})
    port: int = field(default=8080, metadata={"help": "HTTP port"})
    model_repository: Path = field(default=DEFAULT_REPOSITORY,
                                   metadata={"help": "Triton model repository holding one card.yaml per model"})
    models: str = field(default="", metadata={"help": "comma-separated model ids to serve (default: every card)"})
    triton_url: str = field(default="", metadata={
        "help": "gRPC address of an external Triton (e.g. a k8s sidecar); empty = start tritonserver as a child"})
    triton_grpc_port: int = field(default=0, metadata={"help": "gRPC port of the child tritonserver (0 = pick free)"})
    triton_startup_seconds: float = field(default=180.0, metadata={"help": "how long to wait for Triton to come up"})
    triton_metrics_port: int = field(default=0, metadata={
        "help": "child mode: port of the child tritonserver's Prometheus metrics (0 = off)"})
    triton_metrics_address: str = field(default="127.0.0.1", metadata={
        "help": "child mode: address those metrics bind to (a pod's scraper needs 0.0.0.0; gRPC stays on loopback)"})
    max_request_bytes: int = field(default=8_388_608, metadata={
        "help": "largest request body, both as sent and after Content-Encoding is decoded (413 above)"})
    systemone_schema: str = field(default="vllm-sr/5.0", metadata={
        "help": "System One schema of /v1/systemone: vllm-sr/5.0 (strict) or vllm-sr/4.0 (also the internal form)"})
    result_cache: str = field(default="exact", metadata={
        "help": "answered decision questions to cache: exact (models whose numerics are exact), all, or off"})
    result_cache_entries: int = field(default=16384, metadata={"help": "most answers the result cache keeps per model"})
    max_bundle_tasks: int = field(default=64, metadata={
        "help": "most tasks one /v1/bundle request may hold (413 above)"})
    max_queue: int = field(default=8192, metadata={
        "help": "most inputs waiting or running per model before requests get 429 overloaded"})
    shutdown_seconds: float = field(default=30.0, metadata={"help": "how long SIGTERM waits for in-flight requests"})
    threads: int = field(default=0, metadata={
        "help": "ONNX Runtime intra-op threads per model instance (0 = the model config's intra_op_threads)"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    log_format: str = field(default="text", metadata={
        "help": "text, or json: one JSON object per line, with one line per request"})
    triton_restart_limit: int = field(default=5, metadata={
        "help": "child tritonserver restarts allowed within --triton-restart-window-seconds before giving up"})
    triton_restart_window_seconds: float = field(default=600.0, metadata={
        "help": "window over which child tritonserver restarts are counted"})
    triton_restart_backoff_seconds: float = field(default=1.0, metadata={
        "help": "wait before the first restart of a dead child tritonserver; doubles per restart, at most 60 s"})
    triton_check_seconds: float = field(default=1.0, metadata={
        "help": "how often Triton's liveness, model readiness and model instances are checked"})
    model_retry_seconds: float = field(default=10.0, metadata={
        "help": "wait before a model that failed to load or to pass its golden check is tried again; doubles per "
                "try, at most 300 s (0 = never try again)"})
    liveness_failed_seconds: float = field(default=300.0, metadata={
        "help": "how long every model may stay failed (or Triton given up on) before /health/live answers 503, so "
                "the orchestrator replaces the process (0 = never)"})

    @staticmethod
    def env_name(name: str) -> str:
        return ENV_PREFIX + name.upper()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        for f in fields(cls):
            flag = "--" + f.name.replace("_", "-")
            parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(),
                                help=f"{f.metadata['help']} (env {cls.env_name(f.name)}, default {f.default})")

    @classmethod
    def resolve(cls, args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Settings:
        """Flag, else env twin, else default; values are converted to the field's type and checked."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = getattr(args, f.name, None) if args is not None else None
            if raw is None:
                raw = env.get(cls.env_name(f.name))
            if raw is None:
                continue
            kind: Any = type(f.default)
            try:
                values[f.name] = kind(raw)
            except ValueError as exc:
                raise SystemExit(f"{f.name}: {raw!r} is not a valid {kind.__name__}") from exc
        settings = cls(**values)
        if settings.max_request_bytes < 1:
            raise SystemExit("max_request_bytes must be at least 1")
        if settings.result_cache not in ("exact", "all", "off"):
            raise SystemExit(f"result_cache must be exact, all or off, not {settings.result_cache!r}")
        if settings.systemone_schema not in ("vllm-sr/5.0", "vllm-sr/4.0"):
            raise SystemExit(f"systemone_schema must be vllm-sr/5.0 or vllm-sr/4.0, not {settings.systemone_schema!r}")
        if settings.log_format not in ("text", "json"):
            raise SystemExit(f"log_format: {settings.log_format!r} is not text or json")
        if settings.model_retry_seconds < 0 or settings.liveness_failed_seconds < 0:
            raise SystemExit("model_retry_seconds and liveness_failed_seconds must not be negative")
        if settings.triton_check_seconds <= 0 or settings.triton_restart_backoff_seconds < 0:
            raise SystemExit("triton_check_seconds must be positive and triton_restart_backoff_seconds not negative")
        return settings

    @property
    def model_ids(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]
