"""Deployment lifecycle: create, update, stop/start and delete, ordered so a failure never leaves the
catalog and the cluster apart for good.

- create: insert the catalog row (the unique live-name index picks one winner among concurrent creates),
  then create the workload; if Kubernetes fails, the row is removed again. A create whose answer was lost
  adopts its workload; a workload orphaned by an earlier create is replaced.
- update/stop/start: change the workload first (resourceVersion precondition), then the catalog (row
  version precondition); a lost race on either merges onto the newer state and tries again.
- delete: workload first, then mark the record deleted; a workload already gone still marks the record
  deleted (the spec's 404 is kept), so deletion always converges.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from sqlalchemy.exc import IntegrityError

from controlplane import validation as v
from controlplane import workload
from controlplane.auth import Principal
from controlplane.config import Settings
from controlplane.db import utcnow
from controlplane.errors import ApiError, conflict, invalid_request, not_found, unprocessable
from controlplane.kube import KINDS, STOP_ANNOTATION, Kind, KubeBackend, configured
from controlplane.rendering import render
from controlplane.runtime_spec import (
    CREATE_FIELDS,
    PATCH_FIELDS,
    PATCH_REFUSED,
    RUNTIME_FIELDS,
    current_config,
    resolve_runtime,
    visibility_scope,
)
from controlplane.store import (
    WRITE_ATTEMPTS,
    ArtifactRecord,
    DeploymentRecord,
    DeploymentStore,
    EngineRecord,
    ModelRecord,
    StaleRow,
    namespace,
    require_kind,
    workload_kind,
)

log = logging.getLogger(__name__)
WRITE = "deployment:write"


class Lifecycle:
    """The write endpoints' logic."""

    def __init__(self, store: DeploymentStore, kube: KubeBackend | None, settings: Settings) -> None:
        self.store = store
        self.kube = kube
        self.settings = settings

    async def create(self, who: Principal, body: Any) -> dict[str, Any]:
        """Validate, record as pending, then submit the KServe workload."""
        if self.kube is not None:
            who.require_project()  # the spec: a project-scoped token when Kubernetes is configured
        who.require(WRITE)
        # Without Kubernetes the spec asks for write permission only: a system- or domain-scoped token's record
        # belongs to that scope (Principal.owner), visible to the same scope only.
        project = who.owner
        if not isinstance(body, dict):
            raise invalid_request("request body must be a JSON object")
        if unknown := set(body) - CREATE_FIELDS:
            raise invalid_request(f"unknown fields: {', '.join(sorted(unknown))}")
        name = v.display_name(body.get("name"))
        description = v.opt_str(body, "description") or ""
        engine_id = v.opt_str(body, "engineId")
        if not engine_id:
            raise invalid_request("engineId is required")
        model_id, artifact_id = v.opt_str(body, "modelId"), v.opt_str(body, "artifactId")
        model_uri = v.opt_str(body, "modelUri")
        user_labels = v.labels(body.get("labels"))
        async with self.store.reads() as reads:
            eng = await reads.engine(engine_id, project)
            if eng is None:
                raise invalid_request(f"engine {engine_id} not found")
            owners: list[str | None] = [eng.project_id]
            model: ModelRecord | None = None
            if model_id:
                model = await reads.model(model_id, project)
                if model is None:
                    raise invalid_request(f"model {model_id} not found")
                owners.append(model.project_id)
            art: ArtifactRecord | None = None
            if artifact_id:
                art = await reads.artifact(artifact_id, project)
                if art is None:
                    raise invalid_request(f"artifact {artifact_id} not found")
                if not art.ready:
                    raise invalid_request(f"artifact {artifact_id} is not ready")
                owners.append(art.project_id)
            uri_source = art.uri if art is not None else model_uri
            if not uri_source:
                raise invalid_request("artifactId or modelUri is required")
            resolved_uri = v.oci_uri(uri_source)
            runtime, lora_owners = await resolve_runtime(
                reads, project, eng, body, strict_replicas=False, limits=self.settings
            )
        scope = visibility_scope(project, owners + lora_owners)
        if eng.backend_type not in KINDS:
            raise unprocessable(f"engine {eng.id} has an invalid backend {eng.backend_type!r}")

        dep_id = f"deployment-{uuid.uuid4().hex[:12]}"
        name_k8s = workload.k8s_name(name)
        spec: dict[str, Any] = {
            "architecture": self.settings.architecture,
            "k8sName": name_k8s,
            "engineId": eng.id,
            "engineName": eng.name,
            "engineConfigName": eng.config_name,
            "modelId": model.id if model is not None else None,
            "artifactId": art.id if art is not None else None,
            "artifactName": art.name if art is not None else None,
            "modelUri": resolved_uri,
            **runtime,
        }
        labels = {**user_labels, workload.RUNTIME_LABEL: eng.runtime}
        now = utcnow()
        record = DeploymentRecord(
            id=dep_id, name=name, description=description, status="pending", stopped=False,
            project_id=project, project_name=who.project_name, domain_id=who.domain_id,
            domain_name=who.domain_name, owner_user_id=who.user_id, owner_name=who.user_name,
            k8s_name=name_k8s, backend_catalog="k8s" if self.kube else None,
            backend_type=eng.backend_type if self.kube else None, backend_uid=None, scope=scope,
            spec=spec, labels=labels, created_at=now, updated_at=now,
        )
        try:
            await self.store.insert(record)
        except IntegrityError as exc:
            raise conflict(f"a deployment named {name_k8s} already exists in this project") from exc

        if self.kube is not None:
            obj = workload.build_object(
                backend_type=eng.backend_type, name=name_k8s, namespace=namespace(project),
                deployment_id=dep_id, spec=spec, labels=labels, engine=eng,
            )
            try:
                created = await self._submit(KINDS[eng.backend_type], namespace(project), obj, dep_id)
            except ApiError as err:
                if err.status >= 500:  # no definite answer: the apiserver may have stored the workload
                    await self._orphaned(dep_id, f"create answered {err.status}")
                else:  # refused: nothing of ours is in the cluster, so the catalog keeps nothing either
                    await self.store.remove(dep_id)
                raise
            except BaseException as exc:  # cancelled (the caller went away) or broken mid-call: as above
                await self._orphaned(dep_id, type(exc).__name__)
                raise
            await self.store.set_backend_uid(dep_id, (created.get("metadata") or {}).get("uid"))
        return await self._rendered(dep_id)

    async def _rendered(self, dep_id: str) -> dict[str, Any]:
        """The record as stored after a write, rendered (404 if it went meanwhile)."""
        record = await self.store.fetch(dep_id)
        if record is None:
            raise not_found(f"deployment {dep_id} not found")
        return render(record)

    async def _orphaned(self, dep_id: str, why: str) -> None:
        """The workload may exist without anyone knowing: leave the record ``deleting`` for the reconciler,
        which deletes the workload, then the record (a record erased now would orphan the workload for good)."""
        log.warning("deployment %s: create did not finish (%s); left for the reconciler to delete", dep_id, why)
        await asyncio.shield(self.store.mark_deleting(dep_id))

    async def _submit(self, kind: Kind, ns: str, obj: dict[str, Any], dep_id: str) -> dict[str, Any]:
        """Create the workload, recovering the two ways a create can leave the cluster and catalog apart.

        - The call failed without a definite answer (timeout, 5xx) but the apiserver had accepted it: the
          workload carrying this deployment's id label is adopted instead of orphaned.
        - The name is taken by a workload we created for a deployment that no longer has a live record
          (an earlier create that timed out, or a delete that stopped half-way): that orphan is deleted,
          by its uid, and the create is tried once more. Anything else under the name stays a 409.
        """
        kube = configured(self.kube)
        name = obj["metadata"]["name"]
        try:
            return await kube.create(kind, ns, obj)
        except ApiError as err:
            if err.status >= 500:
                found = await self._owned_workload(kube, kind, ns, name)
                if found is not None and workload.deployment_id(found) == dep_id:
                    log.warning("deployment %s: create answered %s but the workload exists; adopted",
                                dep_id, err.status)
                    return found
                raise
            if err.status != 409:
                raise
            found = await self._owned_workload(kube, kind, ns, name)
            owner = workload.deployment_id(found) if found is not None else None
            if found is None or owner is None or await self.store.is_live(owner):
                raise
            log.warning("deployment %s: removing orphaned workload %s/%s of deployment %s", dep_id, ns, name, owner)
            await kube.delete(kind, ns, name, (found.get("metadata") or {}).get("uid"))
            return await kube.create(kind, ns, obj)

    @staticmethod
    async def _owned_workload(kube: KubeBackend, kind: Kind, ns: str, name: str) -> dict[str, Any] | None:
        """The workload under ``name`` if it is one the control plane manages; ``None`` otherwise or unknown."""
        try:
            found = await kube.get(kind, ns, name)
        except ApiError:
            return None
        return found if workload.is_managed(found) else None

    async def update(self, who: Principal, dep_id: str, body: Any) -> dict[str, Any]:
        """Apply allowed fields; runtime changes go to Kubernetes first and make the status pending."""
        if not isinstance(body, dict):
            raise invalid_request("request body must be a JSON object")
        if self.kube is not None and set(body) & RUNTIME_FIELDS:
            who.require_project()  # the spec: project scope only when the workload changes
        who.require(WRITE)
        project = who.owner
        if refused := set(body) & PATCH_REFUSED:
            raise invalid_request(
                f"{', '.join(sorted(refused))} cannot be changed; create a new deployment instead"
            )
        if unknown := set(body) - PATCH_FIELDS:
            raise invalid_request(f"unknown fields: {', '.join(sorted(unknown))}")
        base: dict[str, Any] = {}
        if "name" in body:
            base["name"] = v.display_name(body["name"])
        if "description" in body:
            base["description"] = v.opt_str(body, "description") or ""
        async with self.store.lock(dep_id):
            for _ in range(WRITE_ATTEMPTS - 1):
                try:
                    return await self._update_once(who, dep_id, body, dict(base), project)
                except StaleRow:
                    continue
                except ApiError as err:
                    if err.status != 409 or err.error != "conflict":
                        raise
                    # Kubernetes' resourceVersion precondition: someone replaced the workload meanwhile.
                    continue
            try:
                return await self._update_once(who, dep_id, body, dict(base), project)
            except StaleRow as exc:
                raise conflict(f"deployment {dep_id} changed concurrently; try again") from exc

    async def _update_once(
        self, who: Principal, dep_id: str, body: dict[str, Any], values: dict[str, Any], project: str
    ) -> dict[str, Any]:
        """One read-merge-write round: Kubernetes replace carries the resourceVersion it read, the catalog
        write the row version it read; a lost race on either raises so the caller merges again."""
        async with self.store.reads() as reads:
            row = await reads.deployment(dep_id, who, write=True)
            spec = dict(row.spec)
            runtime_change = bool(set(body) & RUNTIME_FIELDS)
            eng: EngineRecord | None = None
            if runtime_change:
                new_engine_id = body.get("engineId", spec["engineId"])
                if not isinstance(new_engine_id, str) or not new_engine_id:
                    raise invalid_request("engineId must be a non-empty string")
                eng = await reads.engine(new_engine_id, project)
                if eng is None:
                    raise not_found(f"engine {new_engine_id} not found")
                if eng.backend_type not in KINDS:
                    raise unprocessable(f"engine {eng.id} has an invalid backend {eng.backend_type!r}")
                if row.backend_type and eng.backend_type != row.backend_type:
                    raise invalid_request("the engine needs another workload kind; create a new deployment")
                if eng.id != spec["engineId"] and eng.runtime != "vllm" and spec.get("lora"):
                    raise invalid_request("remove the LoRA adapters before switching to a non-vLLM engine")
                cfg = current_config(spec)
                cfg.update({k: body[k] for k in RUNTIME_FIELDS - {"engineId"} if k in body})
                if cfg.get("lora") is not None and not (cfg["lora"] or {}).get("adapters"):
                    cfg["lora"] = None
                runtime, lora_owners = await resolve_runtime(
                    reads, project, eng, cfg, strict_replicas=True, limits=self.settings
                )
                owners = [eng.project_id, *lora_owners]
                scope = visibility_scope(project, owners + ([project] if row.scope == "project" else [None]))
                if scope != row.scope:
                    raise invalid_request("the engine must have the same visibility as the deployed artifact")
                spec.update(runtime)
                spec.update({"engineId": eng.id, "engineName": eng.name, "engineConfigName": eng.config_name})
                spec["endpoint"] = None
                # The spec: every runtime change reports pending, also for a stopped deployment (whose
                # workload keeps its stop annotation; the new configuration applies at the next start).
                values.update(spec=spec, status="pending", stopped=False)
        if runtime_change and self.kube is not None and eng is not None:
            kind = require_kind(row, "invalid_request")
            new_spec = workload.build_spec(kind.name, spec, eng)

            def mutate(obj: dict[str, Any]) -> None:
                obj["spec"] = new_spec
                # Workloads created before the label was forced get it at their next change.
                obj.setdefault("metadata", {}).setdefault("labels", {})[workload.VISIBILITY_LABEL] = (
                    workload.CLUSTER_LOCAL)

            await self.kube.update(kind, namespace(row.project_id), row.k8s_name, row.backend_uid, mutate)
        if values:
            await self.store.write(row, values)
        return await self._rendered(dep_id)

    async def set_stopped(self, who: Principal, dep_id: str, stop: bool) -> dict[str, Any]:
        """Flip the KServe stop annotation; the replica count and configuration are kept."""
        project = who.require_project()
        who.require(WRITE)
        row = await self.store.get(dep_id, who, write=True)
        kube = configured(self.kube)
        kind = require_kind(row, "invalid_backend")
        ns = namespace(project)

        live: dict[str, str | None] = {}

        def mutate(obj: dict[str, Any]) -> None:
            live["endpoint"] = workload.endpoint(obj)  # what KServe reports now (reads keep no snapshot)
            annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
            if stop:
                annotations[STOP_ANNOTATION] = "true"
            else:
                annotations.pop(STOP_ANNOTATION, None)  # the spec: start removes the stop marker

        async with self.store.lock(dep_id):
            await kube.update(kind, ns, row.k8s_name, row.backend_uid, mutate)
            stopped = stop and await self._pods_gone(kube, kind, ns, row.k8s_name)
            status = ("stopped" if stopped else "stopping") if stop else "pending"
            for _ in range(WRITE_ATTEMPTS):
                spec = dict(row.spec)
                spec["endpoint"] = None if stopped or not stop else live.get("endpoint")
                try:
                    await self.store.write(row, {"status": status, "stopped": stopped, "spec": spec})
                    break
                except StaleRow:
                    row = await self.store.get(dep_id, who, write=True)  # merge onto the newer row
            else:
                raise conflict(f"deployment {dep_id} changed concurrently; try again")
        return await self._rendered(dep_id)

    @staticmethod
    async def _pods_gone(kube: KubeBackend, kind: Kind, ns: str, name: str) -> bool:
        """After the annotation is set, "stopped" only if no pod is left; a failed count means "stopping"."""
        try:
            return await kube.count_live_pods(kind, ns, name) == 0
        except ApiError:
            return False

    async def delete(self, who: Principal, dep_id: str) -> None:
        """Workload first, then mark the record deleted.

        A workload that no longer exists is still the spec's 404 ("部署或目标 Kubernetes 对象不存在"), but the
        record is marked deleted as well: deletion converges, the name is free again, and a delete whose
        catalog write failed after the workload went is finished by the next call.
        """
        if self.kube is not None:
            who.require_project()  # the spec: a project-scoped token only when Kubernetes is configured
        who.require(WRITE)
        row = await self.store.get(dep_id, who, write=True)
        gone = False
        kind = workload_kind(row)
        if self.kube is not None and kind is not None:
            gone = not await self.kube.delete(kind, namespace(row.project_id), row.k8s_name, row.backend_uid)
        elif row.backend_catalog == "k8s":
            log.warning("deployment %s: Kubernetes not configured, workload %s kept", dep_id, row.k8s_name)
        await self.store.mark_deleted(dep_id)
        if gone:
            raise not_found(f"deployment {dep_id}: its {row.backend_type} {row.k8s_name} does not exist; "
                            "the record is marked deleted")
