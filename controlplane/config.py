"""Settings read once from the environment (``SR_CP_*``), so the CLI and tests configure the same way."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

DEFAULT_ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    "reader": frozenset({"deployment:read"}),
    "member": frozenset({"deployment:read", "deployment:write"}),
    "admin": frozenset({"deployment:read", "deployment:write", "global:read"}),
}
"""Keystone role -> permissions. ``global:read`` lets admins read every project's deployments."""


@dataclass(frozen=True)
class Settings:
    """Everything the service needs; ``kubeconfig=None`` means Kubernetes is not configured (503)."""

    database_url: str = "sqlite+aiosqlite:///controlplane.db"
    keystone_url: str = "http://127.0.0.1:5000/v3"
    kubeconfig: str | None = None
    kube_timeout_s: float = 10.0
    token_cache_ttl_s: float = 30.0
    role_permissions: dict[str, frozenset[str]] = field(
        default_factory=lambda: dict(DEFAULT_ROLE_PERMISSIONS)
    )
    architecture: str = "amd64"
    probe_timeout_s: float = 3.0
    probe_concurrency: int = 8
    prometheus_url: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Build settings from ``SR_CP_*`` variables; unknown variables are ignored."""
        e = dict(os.environ if env is None else env)
        roles = DEFAULT_ROLE_PERMISSIONS
        if raw := e.get("SR_CP_ROLE_PERMISSIONS"):
            roles = {k: frozenset(v) for k, v in json.loads(raw).items()}
        return cls(
            database_url=e.get("SR_CP_DATABASE_URL", cls.database_url),
            keystone_url=e.get("SR_CP_KEYSTONE_URL", cls.keystone_url).rstrip("/"),
            kubeconfig=e.get("SR_CP_KUBECONFIG") or None,
            kube_timeout_s=float(e.get("SR_CP_KUBE_TIMEOUT_S", cls.kube_timeout_s)),
            token_cache_ttl_s=float(e.get("SR_CP_TOKEN_CACHE_TTL_S", cls.token_cache_ttl_s)),
            role_permissions=dict(roles),
            architecture=e.get("SR_CP_ARCHITECTURE", cls.architecture),
            probe_timeout_s=float(e.get("SR_CP_PROBE_TIMEOUT_S", cls.probe_timeout_s)),
            probe_concurrency=int(e.get("SR_CP_PROBE_CONCURRENCY", cls.probe_concurrency)),
            prometheus_url=e.get("SR_CP_PROMETHEUS_URL") or None,
        )
