"""One typed settings object. Every field has an ``SR_CP_*`` env twin and a flag of ``sr-controlplane serve``
(the gateway's mechanism, :mod:`sr_common.settings`: flag > environment > default). Invalid values stop the start
with the setting's name, so a typo in a deployment manifest fails loudly instead of running with a default."""

from __future__ import annotations

import dataclasses
import json
import os
import ssl
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

from kubernetes.utils import parse_quantity

from sr_common.settings import SettingsBase, SettingsError

__all__ = ["DEFAULT_ROLE_PERMISSIONS", "ENV_PREFIX", "Settings", "SettingsError", "client_ssl", "quantity"]

ENV_PREFIX = "SR_CP_"

DEFAULT_ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "reader": frozenset({"deployment:read"}),
    "member": frozenset({"deployment:read", "deployment:write"}),
    "admin": frozenset({"deployment:read", "deployment:write", "global:read"}),
}
"""Keystone role -> permissions. ``global:read`` lets admins read every project's deployments, but only when
the token is system-scoped or scoped to ``global_read_project_id`` (see :mod:`controlplane.auth`): the admin
role of an ordinary project is that project's admin, not the platform's."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class Settings(SettingsBase):
    """Everything the service needs; ``kubeconfig=None`` means Kubernetes is not configured (503)."""

    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    database_url: str = field(default="sqlite+aiosqlite:///controlplane.db", metadata=_help(
        "catalog database: sqlite+aiosqlite:///PATH or postgresql+asyncpg://USER@HOST/DB"))
    keystone_url: str = field(default="http://127.0.0.1:5000/v3", metadata=_help("Keystone v3 endpoint"))
    keystone_ca_file: str = field(default="", metadata=_help(
        "CA bundle that signs Keystone's TLS certificate (empty: the system CAs)"))
    keystone_timeout_s: float = field(default=10.0, metadata=_help("timeout of one token validation"))
    kubeconfig: str | None = field(default=None, metadata=_help(
        "kubeconfig of the control plane's cluster identity (empty: Kubernetes not configured, 503)"))
    kube_timeout_s: float = field(default=10.0, metadata=_help("timeout of one Kubernetes API call"))
    token_cache_ttl_s: float = field(default=30.0, metadata=_help(
        "how long a validated token is trusted before Keystone is asked again (never past its expires_at)"))
    token_cache_size: int = field(default=10000, metadata=_help(
        "most tokens the validation cache holds; the least recently used goes first"))
    invalid_token_limit: int = field(default=20, metadata=_help(
        "invalid tokens one client address may present per invalid_token_window_s before it gets 429"))
    invalid_token_window_s: float = field(default=60.0, metadata=_help(
        "window of invalid_token_limit; also the longest Retry-After it answers"))
    global_read_project_id: str | None = field(default=None, metadata=_help(
        "Keystone project id whose tokens may use global:read (unset: only system-scoped tokens)"))
    role_permissions: dict[str, frozenset[str]] = field(
        default_factory=lambda: dict(DEFAULT_ROLE_PERMISSIONS),
        metadata=_help('JSON object: Keystone role -> list of permissions, e.g. {"member": ["deployment:read"]}'),
    )
    architecture: str = field(default="amd64", metadata=_help("workload architecture: amd64 or arm64"))
    probe_timeout_s: float = field(default=3.0, metadata=_help("timeout of one api-schemas protocol probe"))
    probe_concurrency: int = field(default=8, metadata=_help("api-schemas probes running at once"))
    prometheus_url: str | None = field(default=None, metadata=_help(
        "Prometheus/Thanos query API for deployment metrics (empty: not configured, 503)"))
    prometheus_ca_file: str = field(default="", metadata=_help(
        "CA bundle that signs Prometheus' TLS certificate (empty: the system CAs)"))
    prometheus_timeout_s: float = field(default=10.0, metadata=_help("timeout of one metrics request"))
    exec_idle_timeout_s: float = field(default=900.0, metadata=_help(
        "a terminal session with no input and no output for this long is closed"))
    exec_max_session_s: float = field(default=14400.0, metadata=_help("longest a terminal session may last"))
    exec_token_recheck_s: float = field(default=300.0, metadata=_help(
        "how often a terminal session's token is validated again (a revoked token ends the session)"))
    reconcile_interval_s: float = field(default=30.0, metadata=_help(
        "seconds between reconciler passes (0: no reconciler in this replica)"))
    orphan_grace_s: float = field(default=600.0, metadata=_help(
        "seconds the reconciler leaves a managed workload with no catalog record alone before deleting it "
        "(negative: never; use that when another control plane with its own catalog manages the same cluster)"))
    reconcile_lease_namespace: str = field(default="default", metadata=_help(
        "namespace of the coordination.k8s.io Lease that elects the one reconciling replica"))
    reconcile_lease_name: str = field(default="sr-controlplane-reconciler", metadata=_help("name of that Lease"))
    reconcile_lease_duration_s: float = field(default=15.0, metadata=_help(
        "a leader that has not renewed the Lease for this long is replaced"))
    reconcile_lease_renew_s: float = field(default=5.0, metadata=_help(
        "how often the leader renews the Lease (its own timer); at most half of reconcile_lease_duration_s"))
    max_replicas: int = field(default=8, metadata=_help("most replicas one deployment may ask for"))
    max_cpu: str = field(default="64", metadata=_help("largest CPU request of one deployment (a quantity)"))
    max_memory: str = field(default="512Gi", metadata=_help(
        "largest memory request of one deployment (a quantity)"))
    max_gpu: int = field(default=8, metadata=_help("most GPUs one deployment may request"))
    max_exec_sessions_per_user: int = field(default=4, metadata=_help(
        "terminal sessions one user may hold open at once in this replica (beyond: 429)"))
    max_log_follows_per_user: int = field(default=8, metadata=_help(
        "log streams with follow one user may hold open at once in this replica (beyond: 429)"))
    session_retry_after_s: int = field(default=30, metadata=_help(
        "Retry-After of a 429 for too many terminal or log-follow sessions"))
    shutdown_timeout_s: float = field(default=60.0, metadata=_help(
        "after SIGTERM, how long requests in flight (log follows and terminals included) may finish before they "
        "are cancelled; keep preStop + this within the pod's terminationGracePeriodSeconds"))
    max_body_bytes: int = field(default=1048576, metadata=_help(
        "largest request body accepted (beyond: 413)"))
    log_format: str = field(default="text", metadata=_help("text, or json: one JSON object per line"))
    log_level: str = field(default="info", metadata=_help("debug, info, warning or error"))

    @classmethod
    def convert(cls, f: dataclasses.Field[Any], raw: str) -> Any:
        """Optional settings (empty: not configured), URLs without a trailing slash, the role JSON."""
        return _convert(f.name, f.type, raw)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Settings from ``SR_CP_*`` variables alone."""
        return cls.resolve(None, env)

    def validate(self) -> None:
        """Reject values no deployment could want; the message names the setting."""
        for name in ("keystone_timeout_s", "kube_timeout_s", "probe_timeout_s", "prometheus_timeout_s",
                     "exec_idle_timeout_s", "exec_max_session_s", "exec_token_recheck_s", "shutdown_timeout_s"):
            if getattr(self, name) <= 0:
                raise _error(name, f"must be positive, got {getattr(self, name)}")
        if self.reconcile_interval_s < 0:
            raise _error("reconcile_interval_s", "must not be negative")
        if self.reconcile_lease_duration_s <= 0:
            raise _error("reconcile_lease_duration_s", "must be positive")
        if self.reconcile_lease_renew_s <= 0:
            raise _error("reconcile_lease_renew_s", "must be positive")
        if self.reconcile_lease_duration_s < 2 * self.reconcile_lease_renew_s:
            raise _error("reconcile_lease_duration_s", f"must be at least twice reconcile_lease_renew_s "
                         f"({self.reconcile_lease_renew_s:g} s): one missed renewal must not lose the Lease")
        if self.token_cache_ttl_s < 0:
            raise _error("token_cache_ttl_s", "must not be negative")
        for name in ("token_cache_size", "invalid_token_limit", "max_replicas", "max_exec_sessions_per_user",
                     "max_log_follows_per_user", "session_retry_after_s", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise _error(name, "must be at least 1")
        if self.max_gpu < 0:
            raise _error("max_gpu", "must not be negative")
        if self.invalid_token_window_s <= 0:
            raise _error("invalid_token_window_s", "must be positive")
        for name in ("max_cpu", "max_memory"):
            if quantity(getattr(self, name)) is None:
                raise _error(name, f"{getattr(self, name)!r} is not a Kubernetes quantity")
        if self.probe_concurrency < 1:
            raise _error("probe_concurrency", "must be at least 1")
        if self.architecture not in ("amd64", "arm64"):
            raise _error("architecture", f"{self.architecture!r} is not amd64 or arm64")
        if self.log_format not in ("text", "json"):
            raise _error("log_format", f"{self.log_format!r} is not text or json")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise _error("log_level", f"{self.log_level!r} is not debug, info, warning or error")
        if not self.database_url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
            raise _error("database_url", "must start with sqlite+aiosqlite:// or postgresql+asyncpg://")
        for name in ("keystone_url", "prometheus_url"):
            url = getattr(self, name)
            if url is not None and not url.startswith(("http://", "https://")):
                raise _error(name, f"{url!r} is not an http(s) URL")
        for name in ("keystone_ca_file", "prometheus_ca_file", "kubeconfig"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise _error(name, f"{path!r} is not a readable file")


def _error(name: str, message: str) -> SettingsError:
    return Settings.error(name, message)


def _convert(name: str, kind: Any, raw: str) -> Any:
    """A raw flag/env string as the field's type; empty optional strings mean "not configured"."""
    kinds = str(kind)
    try:
        if name == "role_permissions":
            parsed = json.loads(raw)
            if not isinstance(parsed, dict) or not all(
                isinstance(v, list) and all(isinstance(p, str) for p in v) for v in parsed.values()
            ):
                raise ValueError("expected a JSON object of role -> list of permission strings")
            return {str(k): frozenset(v) for k, v in parsed.items()}
        if "None" in kinds:
            return raw.strip().rstrip("/") or None if name.endswith("_url") else raw.strip() or None
        if kinds == "float":
            return float(raw)
        if kinds == "int":
            return int(raw)
        return raw.rstrip("/") if name.endswith("_url") else raw
    except ValueError as exc:
        raise _error(name, f"{raw!r} is not valid: {exc}") from exc


def quantity(value: str) -> Decimal | None:
    """A Kubernetes quantity ("500m", "16Gi", "2") as a number, ``None`` when it is not one."""
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, ArithmeticError):
        return None


def client_ssl(ca_file: str) -> ssl.SSLContext | bool:
    """TLS verification for an outgoing client: the given CA bundle, or the system CAs (``True``)."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else True
