"""Pure translation of a deployment's spec snapshot into KServe objects, and of KServe status back.

No I/O here, so the mapping is easy to read next to the spec and to unit test.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from controlplane.kube import GROUP, KINDS, STOP_ANNOTATION
from controlplane.store.records import EngineRecord

MANAGED_BY = "sr-controlplane"
DEPLOYMENT_ID_LABEL = "sr-gateway.io/deployment-id"
RUNTIME_LABEL = "beacon.io/runtime"
VISIBILITY_LABEL = "networking.kserve.io/visibility"
# The spec promises a cluster-internal address; an exposed endpoint would have no authentication at all.
CLUSTER_LOCAL = "cluster-local"
# KServe's modelStatus.transitionStatus when it refused the spec (runtime missing, disabled or not matching)
INVALID_SPEC = "InvalidSpec"
_NAME_MAX = 45  # KServe appends suffixes such as "-predictor" to derived objects; keep them under 63


def k8s_name(display_name: str) -> str:
    """A DNS-1123 label derived from the display name, or a generated one when nothing usable is left."""
    base = re.sub(r"[^a-z0-9-]+", "-", display_name.lower())
    base = re.sub(r"-{2,}", "-", base).strip("-")[:_NAME_MAX].strip("-")
    if not base or not base[0].isalpha():
        base = f"d-{base}".strip("-") if base else f"deployment-{uuid.uuid4().hex[:8]}"
    return base[:_NAME_MAX].strip("-")


def _k8s_resources(res: dict[str, Any] | None) -> dict[str, Any] | None:
    if not res:
        return None
    values = {}
    if res.get("cpu"):
        values["cpu"] = str(res["cpu"])
    if res.get("memory"):
        values["memory"] = str(res["memory"])
    if res.get("gpu"):
        values["nvidia.com/gpu"] = str(res["gpu"])
    return {"requests": dict(values), "limits": dict(values)} if values else None


def _container_overrides(spec: dict[str, Any], engine: EngineRecord) -> dict[str, Any]:
    """The container fields of the workload: the engine's catalog entry, overridden field by field by the
    deployment's own values (env by variable name, resources by key), so a catalog's pinned image and its
    resources reach the pods and not only the catalog table."""
    out: dict[str, Any] = {}
    if image := spec.get("image") or engine.image:
        out["image"] = str(image)
    for key, default in (("command", engine.command), ("args", engine.args)):
        if value := spec.get(key) or default:
            out[key] = [str(x) for x in value]
    env_by_name: dict[str, dict[str, Any]] = {}
    for e in [*(engine.env or []), *(spec.get("env") or [])]:
        env_by_name[str(e["name"])] = dict(e)
    if spec.get("modelName") and "SERVED_MODEL_NAME" not in env_by_name:
        env_by_name["SERVED_MODEL_NAME"] = {"name": "SERVED_MODEL_NAME", "value": spec["modelName"]}
    if env_by_name:
        out["env"] = list(env_by_name.values())
    merged = {**(engine.resources or {}), **{k: v for k, v in (spec.get("resources") or {}).items() if v}}
    if res := _k8s_resources(merged):
        out["resources"] = res
    return out


def build_spec(backend_type: str, spec: dict[str, Any], engine: EngineRecord) -> dict[str, Any]:
    """The KServe ``spec`` for a deployment snapshot and its engine row."""
    replicas = int(spec.get("replicas") or 1)
    overrides = _container_overrides(spec, engine)
    if backend_type == "InferenceService":
        model: dict[str, Any] = {
            "modelFormat": {"name": engine.model_format or engine.runtime},
            "runtime": engine.config_name,
            "storageUri": spec["modelUri"],
            **overrides,
        }
        return {"predictor": {"minReplicas": replicas, "maxReplicas": replicas, "model": model}}
    llm_model: dict[str, Any] = {"uri": spec["modelUri"]}
    if spec.get("modelName"):
        llm_model["name"] = spec["modelName"]
    if lora := spec.get("lora"):
        llm_model["lora"] = {"adapters": [{"name": a["name"], "uri": a["uri"]} for a in lora["adapters"]]}
    out: dict[str, Any] = {
        "model": llm_model,
        "replicas": replicas,
        "baseRefs": [{"name": engine.config_name}],
    }
    if overrides:
        out["template"] = {"containers": [{"name": "main", **overrides}]}
    if kv := spec.get("kvCacheOffloading"):
        out["kvCacheOffloading"] = {"cpu": kv["cpu"], "evictionPolicy": kv.get("evictionPolicy", "lru")}
    return out


def build_object(
    *,
    backend_type: str,
    name: str,
    namespace: str,
    deployment_id: str,
    spec: dict[str, Any],
    labels: dict[str, str],
    engine: EngineRecord,
) -> dict[str, Any]:
    """The full KServe object to create for a new deployment."""
    kind = KINDS[backend_type]
    meta_labels = {**labels, "app.kubernetes.io/managed-by": MANAGED_BY, DEPLOYMENT_ID_LABEL: deployment_id,
                   VISIBILITY_LABEL: CLUSTER_LOCAL}
    return {
        "apiVersion": f"{GROUP}/{kind.version}",
        "kind": kind.name,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": meta_labels,
            "annotations": {"serving.kserve.io/deploymentMode": "Standard", STOP_ANNOTATION: "false"},
        },
        "spec": build_spec(backend_type, spec, engine),
    }


def is_stop_requested(obj: dict[str, Any]) -> bool:
    """Whether the stop annotation is set on the live object."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    return str(ann.get(STOP_ANNOTATION, "false")).lower() == "true"


def conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """KServe conditions in the spec's shape (empty optional fields omitted), plus a ``Ready: False`` carrying
    KServe's ``modelStatus.lastFailureInfo`` when the spec was refused (e.g. its runtime does not exist): KServe then
    reports no Ready condition at all, and the caller must still see why the deployment never becomes ready."""
    status = obj.get("status") or {}
    out = []
    for c in status.get("conditions") or []:
        if not c.get("type"):
            continue
        item = {"type": str(c["type"]), "status": str(c.get("status", "Unknown"))}
        for key in ("reason", "message", "lastTransitionTime"):
            if c.get(key):
                item[key] = str(c[key])
        out.append(item)
    model = status.get("modelStatus") or {}
    failure = model.get("lastFailureInfo") or {}
    if model.get("transitionStatus") == INVALID_SPEC and not any(c["type"] == "Ready" for c in out):
        item = {"type": "Ready", "status": "False", "reason": str(failure.get("reason") or INVALID_SPEC)}
        if failure.get("message"):
            item["message"] = str(failure["message"])
        out.append(item)
    return out


def ready_value(conds: list[dict[str, Any]]) -> str | None:
    """The Ready condition's status (True/False/Unknown), or ``None`` when KServe has not reported it."""
    for c in conds:
        if c["type"] == "Ready":
            return c["status"] if c["status"] in ("True", "False") else "Unknown"
    return None


def endpoint(obj: dict[str, Any]) -> str | None:
    """The in-cluster address, only once KServe has reported the workload Service."""
    status = obj.get("status") or {}
    address = status.get("address") or {}
    if address.get("url"):
        return str(address["url"])
    for item in status.get("addresses") or []:
        if item.get("url"):
            return str(item["url"])
    return None


def deployment_id(obj: dict[str, Any]) -> str | None:
    """The deployment a workload was created for (its id label), if any."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(DEPLOYMENT_ID_LABEL)


def is_managed(obj: dict[str, Any]) -> bool:
    """Whether the control plane created this workload (never touch anyone else's)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and DEPLOYMENT_ID_LABEL in labels
