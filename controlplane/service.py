"""Deployment operations: catalog first or Kubernetes first, chosen so a failure never leaves half a write.

- create: insert the catalog row (the unique live-name index picks one winner among concurrent creates),
  then create the workload; if Kubernetes fails, the row is removed again.
- update/stop/start: change the workload first, then the catalog; a Kubernetes failure changes nothing.
- delete: workload first, then mark the catalog row deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane import validation as v
from controlplane import workload
from controlplane.auth import Principal
from controlplane.catalog import find_visible
from controlplane.config import Settings
from controlplane.db import artifacts, deployments, engines, models, utcnow
from controlplane.errors import (
    ApiError,
    conflict,
    internal,
    invalid_request,
    not_found,
    unavailable,
    unprocessable,
)
from controlplane.kube import KINDS, STOP_ANNOTATION, Kind, KubeBackend
from controlplane.metrics import collect
from controlplane.pods import current_pods
from controlplane.probe import Prober, Target

log = logging.getLogger(__name__)

READ, WRITE = "deployment:read", "deployment:write"
PATCH_FIELDS = frozenset(
    {"name", "description", "engineId", "modelName", "replicas", "image", "command", "args", "env",
     "kvCacheOffloading", "lora"}
)
PATCH_REFUSED = frozenset({"modelId", "artifactId", "modelUri", "resources", "labels"})
CREATE_FIELDS = frozenset(
    {"name", "description", "engineId", "modelId", "artifactId", "modelUri", "modelName", "replicas", "image",
     "command", "args", "env", "resources", "kvCacheOffloading", "labels", "lora"}
)
RUNTIME_FIELDS = PATCH_FIELDS - {"name", "description"}
WRITE_ATTEMPTS = 5  # read-merge-write rounds before a concurrent-write conflict is reported as 409
# The terminal: bash when the image has it, else sh.
TERMINAL_COMMAND = [
    "/bin/sh", "-c", "TERM=xterm-256color; export TERM; command -v bash >/dev/null && exec bash || exec sh"
]


class StaleRow(Exception):
    """The catalog row changed between read and write (its version moved on)."""


def _rfc3339(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _namespace(project_id: str) -> str:
    """One namespace per project, named after the project id (Keystone ids are DNS-safe hex)."""
    return project_id.lower()


def render(row: Any, live: dict[str, Any] | None = None) -> dict[str, Any]:
    """The deployment object of the spec; ``live`` adds ready/conditions read from KServe."""
    spec = {k: val for k, val in dict(row.spec).items() if val not in (None, "", [], {})}
    out: dict[str, Any] = {
        "id": row.id,
        "name": row.name,
        "description": row.description or "",
        "status": row.status,
        "projectId": row.project_id,
        "ownerUserId": row.owner_user_id,
        "backend": {
            "catalog": row.backend_catalog or "",
            "type": row.backend_type or "",
            "id": f"{row.project_id}/{row.k8s_name}",
        },
        "spec": spec,
        "stopped": bool(row.stopped),
        "createdAt": _rfc3339(row.created_at),
        "updatedAt": _rfc3339(row.updated_at),
    }
    for key, col in (("projectName", "project_name"), ("domainId", "domain_id"),
                     ("domainName", "domain_name"), ("ownerName", "owner_name")):
        if getattr(row, col):
            out[key] = getattr(row, col)
    if row.labels:
        out["labels"] = dict(row.labels)
    if live:
        if live.get("ready"):
            out["ready"] = live["ready"]
        if live.get("conditions"):
            out["conditions"] = live["conditions"]
    return out


class DeploymentService:
    """All deployment endpoints' logic; the HTTP layer only parses and renders."""

    def __init__(self, engine: AsyncEngine, kube: KubeBackend | None, settings: Settings) -> None:
        self.db = engine
        self.kube = kube
        self.settings = settings
        self._locks: dict[str, asyncio.Lock] = {}
        self.prober = Prober(settings.probe_timeout_s, settings.probe_concurrency)

    # -- lookups -------------------------------------------------------------------------------------

    async def _get_row(self, conn: AsyncConnection, dep_id: str, who: Principal, *, write: bool) -> Any:
        """A live deployment the caller may see (write: only in the token's project); 404 otherwise."""
        stmt = sa.select(deployments).where(deployments.c.id == dep_id, deployments.c.deleted_at.is_(None))
        if write or not who.global_read:
            stmt = stmt.where(deployments.c.project_id == (who.project_id or ""))
        row = (await conn.execute(stmt)).first()
        if row is None:
            raise not_found(f"deployment {dep_id} not found")
        return row

    def _kind(self, row: Any, code: str) -> Kind:
        """The KServe kind of a deployment's workload; 422 when it has none (created without Kubernetes)."""
        if row.backend_catalog != "k8s" or row.backend_type not in KINDS:
            raise unprocessable(f"deployment {row.id} has no valid Kubernetes workload", error=code)
        return KINDS[row.backend_type]

    def _require_kube(self) -> KubeBackend:
        if self.kube is None:
            raise unavailable("Kubernetes is not configured")
        return self.kube

    # -- list / get ----------------------------------------------------------------------------------

    async def list_page(self, who: Principal, page: int, page_size: int) -> dict[str, Any]:
        """Catalog snapshot, newest first; admins with global read see every project."""
        who.require(READ)
        where: list[sa.ColumnElement[bool]] = [deployments.c.deleted_at.is_(None)]
        if not who.global_read:
            where.append(deployments.c.project_id == (who.project_id or ""))
        try:
            async with self.db.connect() as conn:
                total = await conn.scalar(sa.select(sa.func.count()).select_from(deployments).where(*where))
                stmt = (
                    sa.select(deployments)
                    .where(*where)
                    .order_by(deployments.c.created_at.desc(), deployments.c.id)
                )
                if page_size:
                    stmt = stmt.limit(page_size).offset((page - 1) * page_size)
                rows = (await conn.execute(stmt)).all()
        except SQLAlchemyError as exc:
            log.exception("list deployments")
            raise internal("listing deployments failed") from exc
        items = [render(r) for r in rows]
        return {"items": items, "total": int(total or 0), "page": page, "page_size": page_size}

    async def api_schemas(self, who: Principal) -> dict[str, Any]:
        """Protocols of every deployment the caller may see, probed on the live, ready workloads."""
        who.require(READ)
        where: list[sa.ColumnElement[bool]] = [deployments.c.deleted_at.is_(None)]
        if not who.global_read:
            where.append(deployments.c.project_id == (who.project_id or ""))
        async with self.db.connect() as conn:
            rows = (await conn.execute(sa.select(deployments).where(*where))).all()
        limit = asyncio.Semaphore(self.settings.probe_concurrency)

        async def target(row: Any) -> Target | None:
            """Where to probe, or ``None`` when the workload is not configured, not ready or stopped."""
            if self.kube is None or row.backend_catalog != "k8s" or row.backend_type not in KINDS:
                return None
            async with limit:
                try:
                    obj = await asyncio.wait_for(
                        self.kube.get(KINDS[row.backend_type], _namespace(row.project_id), row.k8s_name),
                        self.settings.probe_timeout_s * 2,
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
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=False)
        if self.kube is None or row.backend_catalog != "k8s" or row.backend_type not in KINDS:
            return render(row)
        kind = KINDS[row.backend_type]
        ns = _namespace(row.project_id)
        try:
            obj = await self.kube.get(kind, ns, row.k8s_name)
            conds = workload.conditions(obj)
            ready = workload.ready_value(conds)
            stopped = False
            if workload.is_stop_requested(obj):
                stopped = await self.kube.count_live_pods(kind, ns, row.k8s_name) == 0
                status = "stopped" if stopped else "stopping"
            else:
                status = "ready" if ready == "True" else "pending"
        except ApiError as err:
            log.warning("deployment %s: live status unavailable (%s); serving catalog", dep_id, err.message)
            return render(row)
        ep = workload.endpoint(obj) if status in ("ready", "stopping") else None
        row = await self._save_status(row, status, stopped, ep)
        return render(row, {"ready": ready, "conditions": conds})

    async def _save_status(self, row: Any, status: str, stopped: bool, ep: str | None) -> Any:
        """Remember what KServe reported, so the list shows a recent snapshot."""
        spec = dict(row.spec)
        if status == row.status and bool(row.stopped) == stopped and spec.get("endpoint") == ep:
            return row
        spec["endpoint"] = ep
        with contextlib.suppress(StaleRow):  # a concurrent write won; this snapshot is older than it
            await self._write(row, {"status": status, "stopped": stopped, "spec": spec})
        async with self.db.connect() as conn:
            fresh = (await conn.execute(sa.select(deployments).where(deployments.c.id == row.id))).first()
        return fresh or row

    # -- create --------------------------------------------------------------------------------------

    async def _resolve_runtime(
        self, conn: AsyncConnection, project: str, eng: Any, cfg: dict[str, Any], *, strict_replicas: bool
    ) -> tuple[dict[str, Any], list[str | None]]:
        """Validate the runtime part of a configuration against its engine; returns spec fields and the
        owners (project ids) of every LoRA artifact, for the visibility rule."""
        is_vllm = eng.runtime == "vllm"
        out: dict[str, Any] = {"replicas": v.replicas(cfg.get("replicas"), strict=strict_replicas)}
        for key in ("image", "modelName"):
            val = cfg.get(key)
            if val is not None and not isinstance(val, str):
                raise invalid_request(f"{key} must be a string")
            out[key] = val or None
        out["command"] = v.str_list(cfg["command"], "command") if cfg.get("command") is not None else None
        out["args"] = v.str_list(cfg["args"], "args") if cfg.get("args") is not None else None
        out["env"] = v.env_list(cfg["env"]) if cfg.get("env") is not None else None
        out["resources"] = v.resources(cfg.get("resources"))
        kv = v.kv_cache_offloading(cfg.get("kvCacheOffloading"))
        if kv is not None:
            if not is_vllm:
                raise invalid_request("kvCacheOffloading is only supported for vLLM engines")
            if not v.has_accelerator(out["resources"], eng.resources):
                raise invalid_request("kvCacheOffloading requires an engine or deployment with accelerators")
            if v.mentions_kv_transfer(out["command"], out["args"], out["env"], eng.command, eng.args,
                                      eng.env, eng.engine_yaml):
                raise invalid_request("kvCacheOffloading cannot be combined with --kv-transfer-config")
        out["kvCacheOffloading"] = kv
        adapters = v.lora_request(cfg.get("lora"))
        owners: list[str | None] = []
        if adapters and not is_vllm:
            raise invalid_request("LoRA adapters are only supported for vLLM engines")
        resolved = []
        for a in adapters:
            art = await find_visible(conn, artifacts, a["artifactId"], project)
            if art is None:
                raise invalid_request(f"LoRA artifact {a['artifactId']} not found")
            if not art.ready or not art.lora or not v.is_digest_pinned(art.uri):
                raise invalid_request(
                    f"LoRA artifact {art.id} must be ready, flagged as LoRA and pinned by digest"
                )
            if "modelId" in a and await find_visible(conn, models, a["modelId"], project) is None:
                raise invalid_request(f"LoRA model {a['modelId']} not found")
            owners.append(art.project_id)
            resolved.append({**a, "uri": art.uri})
        out["lora"] = {"adapters": resolved} if resolved else None
        return out, owners

    @staticmethod
    def _scope(project: str, owners: list[str | None]) -> str:
        """All public or all this project's; anything else is refused."""
        if all(o is None for o in owners):
            return "public"
        if all(o == project for o in owners):
            return "project"
        raise invalid_request("engine, model and artifacts must all be public or all belong to this project")

    async def create(self, who: Principal, body: Any) -> dict[str, Any]:
        """Validate, record as pending, then submit the KServe workload."""
        if self.kube is not None:
            who.require_project()  # the spec: a project-scoped token when Kubernetes is configured
        who.require(WRITE)
        project = who.require_project()  # without Kubernetes the record still belongs to a project
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
        async with self.db.connect() as conn:
            eng = await find_visible(conn, engines, engine_id, project)
            if eng is None:
                raise invalid_request(f"engine {engine_id} not found")
            owners: list[str | None] = [eng.project_id]
            model = None
            if model_id:
                model = await find_visible(conn, models, model_id, project)
                if model is None:
                    raise invalid_request(f"model {model_id} not found")
                owners.append(model.project_id)
            art = None
            if artifact_id:
                art = await find_visible(conn, artifacts, artifact_id, project)
                if art is None:
                    raise invalid_request(f"artifact {artifact_id} not found")
                if not art.ready:
                    raise invalid_request(f"artifact {artifact_id} is not ready")
                owners.append(art.project_id)
            uri_source = art.uri if art is not None else model_uri
            if not uri_source:
                raise invalid_request("artifactId or modelUri is required")
            resolved_uri = v.oci_uri(uri_source)
            runtime, lora_owners = await self._resolve_runtime(
                conn, project, eng, body, strict_replicas=False
            )
        scope = self._scope(project, owners + lora_owners)
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
        record = {
            "id": dep_id, "name": name, "description": description, "status": "pending", "stopped": False,
            "project_id": project, "project_name": who.project_name, "domain_id": who.domain_id,
            "domain_name": who.domain_name, "owner_user_id": who.user_id, "owner_name": who.user_name,
            "k8s_name": name_k8s, "backend_catalog": "k8s" if self.kube else None,
            "backend_type": eng.backend_type if self.kube else None, "backend_uid": None, "scope": scope,
            "spec": spec, "labels": labels, "created_at": now, "updated_at": now,
        }
        try:
            async with self.db.begin() as conn:
                await conn.execute(deployments.insert().values(**record))
        except IntegrityError as exc:
            raise conflict(f"a deployment named {name_k8s} already exists in this project") from exc

        if self.kube is not None:
            obj = workload.build_object(
                backend_type=eng.backend_type, name=name_k8s, namespace=_namespace(project),
                deployment_id=dep_id, spec=spec, labels=labels, engine=eng._asdict(),
            )
            try:
                created = await self._submit(KINDS[eng.backend_type], _namespace(project), obj, dep_id)
            except BaseException:
                # Nothing of ours is in the cluster: the catalog must not keep the record either.
                async with self.db.begin() as conn:
                    await conn.execute(deployments.delete().where(deployments.c.id == dep_id))
                raise
            record["backend_uid"] = (created.get("metadata") or {}).get("uid")
            async with self.db.begin() as conn:
                await conn.execute(
                    deployments.update()
                    .where(deployments.c.id == dep_id)
                    .values(backend_uid=record["backend_uid"])
                )
        async with self.db.connect() as conn:
            row = (await conn.execute(sa.select(deployments).where(deployments.c.id == dep_id))).one()
        return render(row)

    async def _submit(self, kind: Kind, ns: str, obj: dict[str, Any], dep_id: str) -> dict[str, Any]:
        """Create the workload, recovering the two ways a create can leave the cluster and catalog apart.

        - The call failed without a definite answer (timeout, 5xx) but the apiserver had accepted it: the
          workload carrying this deployment's id label is adopted instead of orphaned.
        - The name is taken by a workload we created for a deployment that no longer has a live record
          (an earlier create that timed out, or a delete that stopped half-way): that orphan is deleted,
          by its uid, and the create is tried once more. Anything else under the name stays a 409.
        """
        kube = self._require_kube()
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
            if found is None or owner is None or await self._is_live(owner):
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

    async def _is_live(self, dep_id: str) -> bool:
        """Whether a deployment record exists and is not marked deleted."""
        async with self.db.connect() as conn:
            hit = await conn.scalar(
                sa.select(deployments.c.id).where(deployments.c.id == dep_id, deployments.c.deleted_at.is_(None))
            )
        return hit is not None

    # -- update --------------------------------------------------------------------------------------

    async def update(self, who: Principal, dep_id: str, body: Any) -> dict[str, Any]:
        """Apply allowed fields; runtime changes go to Kubernetes first and make the status pending."""
        if not isinstance(body, dict):
            raise invalid_request("request body must be a JSON object")
        if self.kube is not None and set(body) & RUNTIME_FIELDS:
            who.require_project()  # the spec: project scope only when the workload changes
        who.require(WRITE)
        project = who.project_id or ""
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
        async with self._write_lock(dep_id):
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
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=True)
            spec = dict(row.spec)
            runtime_change = bool(set(body) & RUNTIME_FIELDS)
            eng: Any = None
            if runtime_change:
                new_engine_id = body.get("engineId", spec["engineId"])
                if not isinstance(new_engine_id, str) or not new_engine_id:
                    raise invalid_request("engineId must be a non-empty string")
                eng = await find_visible(conn, engines, new_engine_id, project)
                if eng is None:
                    raise not_found(f"engine {new_engine_id} not found")
                if eng.backend_type not in KINDS:
                    raise unprocessable(f"engine {eng.id} has an invalid backend {eng.backend_type!r}")
                if row.backend_type and eng.backend_type != row.backend_type:
                    raise invalid_request("the engine needs another workload kind; create a new deployment")
                if eng.id != spec["engineId"] and eng.runtime != "vllm" and spec.get("lora"):
                    raise invalid_request("remove the LoRA adapters before switching to a non-vLLM engine")
                cfg = self._current_config(spec)
                cfg.update({k: body[k] for k in RUNTIME_FIELDS - {"engineId"} if k in body})
                if cfg.get("lora") is not None and not (cfg["lora"] or {}).get("adapters"):
                    cfg["lora"] = None
                runtime, lora_owners = await self._resolve_runtime(
                    conn, project, eng, cfg, strict_replicas=True
                )
                owners = [eng.project_id, *lora_owners]
                scope = self._scope(project, owners + ([project] if row.scope == "project" else [None]))
                if scope != row.scope:
                    raise invalid_request("the engine must have the same visibility as the deployed artifact")
                spec.update(runtime)
                spec.update({"engineId": eng.id, "engineName": eng.name, "engineConfigName": eng.config_name})
                spec["endpoint"] = None
                # The spec: every runtime change reports pending, also for a stopped deployment (whose
                # workload keeps its stop annotation; the new configuration applies at the next start).
                values.update(spec=spec, status="pending", stopped=False)
        if runtime_change and self.kube is not None and eng is not None:
            kind = self._kind(row, "invalid_request")
            new_spec = workload.build_spec(row.backend_type, spec, eng._asdict())

            def mutate(obj: dict[str, Any]) -> None:
                obj["spec"] = new_spec

            await self.kube.update(kind, _namespace(row.project_id), row.k8s_name, row.backend_uid, mutate)
        if values:
            await self._write(row, values)
        async with self.db.connect() as conn:
            fresh = (await conn.execute(sa.select(deployments).where(deployments.c.id == dep_id))).one()
        return render(fresh)

    async def _write(self, row: Any, values: dict[str, Any]) -> None:
        """Compare-and-set on the row version read with ``row``; :class:`StaleRow` when another write won."""
        async with self.db.begin() as conn:
            res = await conn.execute(
                deployments.update()
                .where(deployments.c.id == row.id, deployments.c.version == row.version,
                       deployments.c.deleted_at.is_(None))
                .values(**values, version=row.version + 1, updated_at=utcnow())
            )
        if res.rowcount != 1:
            raise StaleRow(row.id)

    def _write_lock(self, dep_id: str) -> asyncio.Lock:
        """Writers of one deployment in this process take turns (the row version covers other replicas)."""
        lock = self._locks.get(dep_id)
        if lock is None:
            if len(self._locks) > 10_000:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[dep_id] = asyncio.Lock()
        return lock

    @staticmethod
    def _current_config(spec: dict[str, Any]) -> dict[str, Any]:
        """The stored snapshot in request form, so an update re-validates the merged result."""
        cfg = {k: spec.get(k) for k in ("replicas", "image", "modelName", "command", "args", "env",
                                        "resources", "kvCacheOffloading")}
        if spec.get("lora"):
            cfg["lora"] = {"adapters": [{k: a[k] for k in ("name", "artifactId", "modelId") if k in a}
                                        for a in spec["lora"]["adapters"]]}
        return cfg

    # -- stop / start / delete -----------------------------------------------------------------------

    async def set_stopped(self, who: Principal, dep_id: str, stop: bool) -> dict[str, Any]:
        """Flip the KServe stop annotation; the replica count and configuration are kept."""
        project = who.require_project()
        who.require(WRITE)
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=True)
        kube = self._require_kube()
        kind = self._kind(row, "invalid_backend")
        ns = _namespace(project)

        def mutate(obj: dict[str, Any]) -> None:
            annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
            if stop:
                annotations[STOP_ANNOTATION] = "true"
            else:
                annotations.pop(STOP_ANNOTATION, None)  # the spec: start removes the stop marker

        async with self._write_lock(dep_id):
            await kube.update(kind, ns, row.k8s_name, row.backend_uid, mutate)
            stopped = stop and await self._pods_gone(kube, kind, ns, row.k8s_name)
            status = ("stopped" if stopped else "stopping") if stop else "pending"
            for _ in range(WRITE_ATTEMPTS):
                spec = dict(row.spec)
                if stopped or not stop:
                    spec["endpoint"] = None
                try:
                    await self._write(row, {"status": status, "stopped": stopped, "spec": spec})
                    break
                except StaleRow:
                    async with self.db.connect() as conn:  # merge onto what the other writer stored
                        row = await self._get_row(conn, dep_id, who, write=True)
            else:
                raise conflict(f"deployment {dep_id} changed concurrently; try again")
        async with self.db.connect() as conn:
            fresh = (await conn.execute(sa.select(deployments).where(deployments.c.id == dep_id))).one()
        return render(fresh)

    @staticmethod
    async def _pods_gone(kube: KubeBackend, kind: Kind, ns: str, name: str) -> bool:
        """After the annotation is set, "stopped" only if no pod is left; a failed count means "stopping"."""
        try:
            return await kube.count_live_pods(kind, ns, name) == 0
        except ApiError:
            return False

    async def pods(self, who: Principal, dep_id: str) -> dict[str, Any]:
        """Current workload pods (not the succeeded ones), sorted by name."""
        who.require(READ)
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=False)
        kube = self._require_kube()
        kind = self._kind(row, "invalid_backend")
        ns = _namespace(row.project_id)
        await kube.get(kind, ns, row.k8s_name)  # 404 when the workload itself is gone
        return {"items": current_pods(await kube.list_pods(kind, ns, row.k8s_name))}

    async def _target_pod(
        self, who: Principal, dep_id: str, pod: str | None, container: str | None, permission: str
    ) -> tuple[KubeBackend, str, str]:
        """Namespace and pod for logs/exec: ``pod`` required when there are several, and must be ours."""
        who.require(permission)
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=permission == WRITE)
        kube = self._require_kube()
        kind = self._kind(row, "invalid_backend")
        ns = _namespace(row.project_id)
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
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=False)
        kube = self._require_kube()
        if not self.settings.prometheus_url:
            raise unavailable("monitoring (Prometheus) is not configured")
        kind = self._kind(row, "invalid_backend")
        ns = _namespace(row.project_id)
        pod_names = [str(p.metadata.name) for p in await kube.list_pods(kind, ns, row.k8s_name) if p.metadata]
        want_vllm = (runtime or "").lower() == "vllm"
        if want_vllm:
            try:
                want_vllm = workload.endpoint(await kube.get(kind, ns, row.k8s_name)) is not None
            except ApiError:
                want_vllm = False
        return await collect(self.settings.prometheus_url, ns, pod_names, range_key, want_vllm)

    async def delete(self, who: Principal, dep_id: str) -> None:
        """Workload first, then mark the record deleted.

        A workload that no longer exists is still the spec's 404 ("部署或目标 Kubernetes 对象不存在"), but the
        record is marked deleted as well: deletion converges, the name is free again, and a delete whose
        catalog write failed after the workload went is finished by the next call.
        """
        if self.kube is not None:
            who.require_project()  # the spec: a project-scoped token only when Kubernetes is configured
        who.require(WRITE)
        async with self.db.connect() as conn:
            row = await self._get_row(conn, dep_id, who, write=True)
        gone = False
        if self.kube is not None and row.backend_catalog == "k8s" and row.backend_type in KINDS:
            kind = KINDS[row.backend_type]
            gone = not await self.kube.delete(kind, _namespace(row.project_id), row.k8s_name, row.backend_uid)
        elif row.backend_catalog == "k8s":
            log.warning("deployment %s: Kubernetes not configured, workload %s kept", dep_id, row.k8s_name)
        await self._mark_deleted(dep_id)
        if gone:
            raise not_found(f"deployment {dep_id}: its {row.backend_type} {row.k8s_name} does not exist; "
                            "the record is marked deleted")

    async def _mark_deleted(self, dep_id: str) -> None:
        now = utcnow()
        async with self.db.begin() as conn:
            await conn.execute(
                deployments.update().where(deployments.c.id == dep_id, deployments.c.deleted_at.is_(None))
                .values(deleted_at=now, updated_at=now, version=deployments.c.version + 1)
            )
