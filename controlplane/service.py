"""The deployments service the HTTP layer calls: reads here (list, detail, api-schemas; reads never write),
writes in
:mod:`controlplane.lifecycle`, workload access in :mod:`controlplane.workload_access`; records through
:mod:`controlplane.store`, responses through :mod:`controlplane.rendering`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane import workload
from controlplane.auth import Principal
from controlplane.config import Settings
from controlplane.errors import ApiError, internal
from controlplane.kube import KubeBackend
from controlplane.lifecycle import Lifecycle
from controlplane.probe import Prober, Target
from controlplane.reconciler import live_view
from controlplane.rendering import render
from controlplane.store import DeploymentRecord, DeploymentStore, namespace, workload_kind
from controlplane.workload_access import READ, WorkloadAccess

log = logging.getLogger(__name__)


class DeploymentService:
    """All deployment endpoints' logic; the HTTP layer only parses and renders."""

    def __init__(self, engine: AsyncEngine, kube: KubeBackend | None, settings: Settings) -> None:
        self.store = DeploymentStore(engine)
        self.kube = kube
        self.settings = settings
        self.prober = Prober(settings.probe_timeout_s, settings.probe_concurrency)
        self.lifecycle = Lifecycle(self.store, kube, settings)
        self.access = WorkloadAccess(self.store, kube, settings)
        self.create = self.lifecycle.create
        self.update = self.lifecycle.update
        self.set_stopped = self.lifecycle.set_stopped
        self.delete = self.lifecycle.delete
        self.pods = self.access.pods
        self.open_logs = self.access.open_logs
        self.open_exec = self.access.open_exec
        self.metrics = self.access.metrics

    async def list_page(self, who: Principal, page: int, page_size: int) -> dict[str, Any]:
        """Catalog snapshot, newest first; admins with global read see every project."""
        who.require(READ)
        try:
            total, rows = await self.store.page(who, page, page_size)
        except SQLAlchemyError as exc:
            log.exception("list deployments")
            raise internal("listing deployments failed") from exc
        return {"items": [render(r) for r in rows], "total": total, "page": page, "page_size": page_size}

    async def api_schemas(self, who: Principal) -> dict[str, Any]:
        """Protocols of every deployment the caller may see, probed on the live, ready workloads."""
        who.require(READ)
        rows = await self.store.all_visible(who)
        limit = asyncio.Semaphore(self.settings.probe_concurrency)

        async def target(row: DeploymentRecord) -> Target | None:
            """Where to probe, or ``None`` when the workload is not configured, not ready or stopped."""
            kind = workload_kind(row)
            if self.kube is None or kind is None:
                return None
            async with limit:
                try:
                    obj = await asyncio.wait_for(
                        self.kube.get(kind, namespace(row.project_id), row.k8s_name), self.settings.probe_timeout_s * 2
                    )
                except (ApiError, TimeoutError):
                    return None
            ready = workload.ready_value(workload.conditions(obj)) == "True"
            ep = workload.endpoint(obj)
            if not ready or workload.is_stop_requested(obj) or not ep:
                return None
            meta = obj.get("metadata") or {}
            model = dict(row.spec).get("modelName")
            return Target(ep, model, (meta.get("uid"), meta.get("generation"), ep, model))

        found = await asyncio.gather(*(target(r) for r in rows))
        targets = {r.id: t for r, t in zip(rows, found, strict=True)}
        return {"items": await self.prober.probe_all(targets)}

    async def get(self, who: Principal, dep_id: str) -> dict[str, Any]:
        """Catalog record refreshed from the live KServe object; the catalog alone if that cannot be read."""
        who.require(READ)
        row = await self.store.get(dep_id, who, write=False)
        kind = workload_kind(row)
        if self.kube is None or kind is None:
            return render(row)
        ns = namespace(row.project_id)
        try:
            obj = await self.kube.get(kind, ns, row.k8s_name)
            pods = await self.kube.count_live_pods(kind, ns, row.k8s_name) if workload.is_stop_requested(obj) else None
        except ApiError as err:
            log.warning("deployment %s: live status unavailable (%s); serving catalog", dep_id, err.message)
            return render(row)
        view = live_view(obj, pods)
        # Reads never write: the reconciler keeps the catalog in step; this response shows the live view.
        spec = {**dict(row.spec), "endpoint": view["endpoint"]}
        shown = dataclasses.replace(row, status=view["status"], stopped=view["stopped"], spec=spec)
        return render(shown, {"ready": view["ready"], "conditions": view["conditions"]})
