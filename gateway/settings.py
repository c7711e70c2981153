"""One typed settings object. Every field is a CLI flag of `sr-gateway serve` and has an `SR_GATEWAY_*` env twin.

Precedence: flag > environment > default (the mechanism is sr_common.settings, shared with the control plane); an
invalid value stops the start with a SettingsError naming the setting. The configuration table in README.md lists
them. Durations end in `_s` as the control plane's do; their former `_seconds` names (`--shutdown-seconds`,
`SR_GATEWAY_SHUTDOWN_SECONDS`, ...) still work for this release, with a warning naming the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sr_common.settings import SettingsBase, SettingsError

__all__ = ["DEFAULT_REPOSITORY", "ENV_PREFIX", "Settings", "SettingsError"]

ENV_PREFIX = "SR_GATEWAY_"
DEFAULT_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"


@dataclass(frozen=True)
class Settings(SettingsBase):
    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    host: str = field(default="127.0.0.1", metadata={"help": "address the HTTP API binds to"})
    port: int = field(default=8080, metadata={"help": "HTTP port"})
    model_repository: Path = field(default=DEFAULT_REPOSITORY,
                                   metadata={"help": "Triton model repository holding one card.yaml per model"})
    models: str = field(default="", metadata={"help": "comma-separated model ids to serve (default: every card)"})
    triton_url: str = field(default="", metadata={
        "help": "gRPC address of an external Triton (e.g. a k8s sidecar); empty = start tritonserver as a child"})
    triton_grpc_port: int = field(default=0, metadata={"help": "gRPC port of the child tritonserver (0 = pick free)"})
    triton_startup_s: float = field(default=180.0, metadata={
        "formerly": "triton_startup_seconds", "help": "how long to wait for Triton to come up"})
    triton_allocator: str = field(default="auto", metadata={
        "help": "child mode: tritonserver's malloc: auto (jemalloc where libjemalloc.so.2 is installed, else glibc), "
                "jemalloc (required) or glibc; its Python stubs keep glibc's either way"})
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
    shutdown_s: float = field(default=30.0, metadata={
        "formerly": "shutdown_seconds", "help": "how long SIGTERM waits for in-flight requests"})
    threads: int = field(default=0, metadata={
        "help": "ONNX Runtime intra-op threads per model instance (0 = the model config's intra_op_threads)"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    log_format: str = field(default="text", metadata={
        "help": "text, or json: one JSON object per line, with one line per request"})
    triton_restart_limit: int = field(default=5, metadata={
        "help": "child tritonserver restarts allowed within --triton-restart-window-s before giving up"})
    triton_restart_window_s: float = field(default=600.0, metadata={"formerly": "triton_restart_window_seconds",
        "help": "window over which child tritonserver restarts are counted"})
    triton_restart_backoff_s: float = field(default=1.0, metadata={"formerly": "triton_restart_backoff_seconds",
        "help": "wait before the first restart of a dead child tritonserver; doubles per restart, at most 60 s"})
    triton_check_s: float = field(default=1.0, metadata={"formerly": "triton_check_seconds",
        "help": "how often Triton's liveness, model readiness and model instances are checked"})
    model_retry_s: float = field(default=10.0, metadata={"formerly": "model_retry_seconds",
        "help": "wait before a model that failed to load or to pass its golden check is tried again; doubles per "
                "try, at most 300 s (0 = never try again)"})
    liveness_failed_s: float = field(default=300.0, metadata={"formerly": "liveness_failed_seconds",
        "help": "how long every model may stay failed (or Triton given up on) before /health/live answers 503, so "
                "the orchestrator replaces the process (0 = never)"})

    def validate(self) -> None:
        """The values no deployment could want, refused at start with the setting named."""
        if self.max_request_bytes < 1:
            raise self.error("max_request_bytes", "must be at least 1")
        if self.result_cache not in ("exact", "all", "off"):
            raise self.error("result_cache", f"must be exact, all or off, not {self.result_cache!r}")
        if self.systemone_schema not in ("vllm-sr/5.0", "vllm-sr/4.0"):
            raise self.error("systemone_schema", f"must be vllm-sr/5.0 or vllm-sr/4.0, not {self.systemone_schema!r}")
        from .supervisor import ALLOCATORS, AllocatorError, triton_preload

        if self.triton_allocator not in ALLOCATORS:
            raise self.error("triton_allocator", f"must be auto, jemalloc or glibc, not {self.triton_allocator!r}")
        if self.triton_allocator == "jemalloc" and not self.triton_url:
            try:
                triton_preload("jemalloc")
            except AllocatorError as exc:
                raise self.error("triton_allocator", str(exc)) from None
        if self.log_format not in ("text", "json"):
            raise self.error("log_format", f"{self.log_format!r} is not text or json")
        for name in ("model_retry_s", "liveness_failed_s", "triton_restart_backoff_s"):
            if getattr(self, name) < 0:
                raise self.error(name, f"must not be negative, got {getattr(self, name)}")
        if self.triton_check_s <= 0:
            raise self.error("triton_check_s", f"must be positive, got {self.triton_check_s}")

    @property
    def model_ids(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]
