"""Reaching into a deployment's workload: its pods, container logs, terminal sessions and metrics.

All four resolve the record the same way (visibility, then the workload kind, 422 invalid_backend when
there is none) and talk to the cluster with the control plane's own credentials.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from controlplane import workload
from controlplane.auth import Principal
from controlplane.config import Settings, client_ssl
from controlplane.errors import ApiError, not_found, unavailable
from controlplane.kube import KubeBackend, configured
from controlplane.metrics import collect
from controlplane.pods import current_pods
from controlplane.store import DeploymentStore, namespace, require_kind

READ, WRITE = "deployment:read", "deployment:write"
# The terminal: bash when the image has it, else sh.
TERMINAL_COMMAND = [
    "/bin/sh", "-c", "TERM=xterm-256color; export TERM; command -v bash >/dev/null && exec bash || exec sh"
]


class WorkloadAccess:
    """Pods, logs, exec and metrics of one deployment's workload."""

    def __init__(self, store: DeploymentStore, kube: KubeBackend | None, settings: Settings) -> None:
        self.store = store
        self.kube = kube
        self.settings = settings

    async def pods(self, who: Principal, dep_id: str) -> dict[str, Any]:
        """Current workload pods (not the succeeded ones), sorted by name."""
        who.require(READ)
        row = await self.store.get(dep_id, who, write=False)
        kube = configured(self.kube)
        kind = require_kind(row, "invalid_backend")
        ns = namespace(row.project_id)
        await kube.get(kind, ns, row.k8s_name)  # 404 when the workload itself is gone
        return {"items": current_pods(await kube.list_pods(kind, ns, row.k8s_name))}

    async def _target_pod(
        self, who: Principal, dep_id: str, pod: str | None, container: str | None, permission: str
    ) -> tuple[KubeBackend, str, str]:
        """Namespace and pod for logs/exec: ``pod`` required when there are several, and must be ours."""
        who.require(permission)
        row = await self.store.get(dep_id, who, write=permission == WRITE)
        kube = configured(self.kube)
        kind = require_kind(row, "invalid_backend")
        ns = namespace(row.project_id)
        await kube.get(kind, ns, row.k8s_name)
        views = current_pods(await kube.list_pods(kind, ns, row.k8s_name))
        names = [p["name"] for p in views]
        if not names:
            raise ApiError(404, "no_pods", f"deployment {dep_id} has no workload pods")
        if not pod:
            if len(names) > 1:
                raise ApiError(400, "pod_required", f"deployment {dep_id} has {len(names)} pods; choose one")
            pod = names[0]
        elif pod not in names:
            raise ApiError(400, "invalid_pod", f"pod {pod} does not belong to deployment {dep_id}")
        containers = next(v["containers"] for v in views if v["name"] == pod)
        if container and container not in [c["name"] for c in containers]:
            raise not_found(f"container {container} not found in pod {pod}")
        return kube, ns, pod

    async def open_exec(
        self, who: Principal, dep_id: str, pod: str | None, container: str | None
    ) -> aiohttp.ClientWebSocketResponse:
        """Open the pod exec session for a terminal; needs write permission (it runs commands)."""
        kube, ns, pod = await self._target_pod(who, dep_id, pod, container, WRITE)
        return await kube.open_exec(ns, pod, container, TERMINAL_COMMAND)

    async def open_logs(
        self, who: Principal, dep_id: str, pod: str | None, container: str | None, follow: bool, tail: int
    ) -> aiohttp.ClientResponse:
        """Open the log of the resolved pod."""
        kube, ns, pod = await self._target_pod(who, dep_id, pod, container, READ)
        return await kube.open_log(ns, pod, container, follow, tail)

    async def metrics(self, who: Principal, dep_id: str, range_key: str | None, runtime: str | None) -> Any:
        """Resource series (and vLLM series when asked for and the workload Service exists)."""
        who.require(READ)
        row = await self.store.get(dep_id, who, write=False)
        kube = configured(self.kube)
        if not self.settings.prometheus_url:
            raise unavailable("monitoring (Prometheus) is not configured")
        kind = require_kind(row, "invalid_backend")
        ns = namespace(row.project_id)
        pod_names = [str(p.metadata.name) for p in await kube.list_pods(kind, ns, row.k8s_name) if p.metadata]
        want_vllm = (runtime or "").lower() == "vllm"
        if want_vllm:
            try:
                want_vllm = workload.endpoint(await kube.get(kind, ns, row.k8s_name)) is not None
            except ApiError:
                want_vllm = False
        return await collect(self.settings.prometheus_url, ns, pod_names, range_key, want_vllm,
                             self.settings.prometheus_timeout_s, client_ssl(self.settings.prometheus_ca_file))
