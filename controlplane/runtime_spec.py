"""Runtime spec resolution: a deployment's requested configuration checked against its engine and the
catalog (LoRA artifacts, visibility), shared by create and update so both apply the same rules."""

from __future__ import annotations

from typing import Any

from controlplane import validation as v
from controlplane.catalog import image_pin_problem
from controlplane.config import Settings
from controlplane.errors import invalid_request
from controlplane.store import CatalogReads, EngineRecord

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


async def resolve_runtime(
    reads: CatalogReads, project: str, eng: EngineRecord, cfg: dict[str, Any], *, strict_replicas: bool,
    limits: Settings,
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
    if out["image"] and (problem := image_pin_problem(out["image"])):
        raise invalid_request(f"image {out['image']!r} {problem}; pin a version tag or a digest")
    out["resources"] = v.resources(cfg.get("resources"))
    v.within_limits(out["replicas"], effective_resources(out["resources"], eng.resources), limits,
                    engine_id=eng.id)
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
        art = await reads.artifact(a["artifactId"], project)
        if art is None:
            raise invalid_request(f"LoRA artifact {a['artifactId']} not found")
        if not art.ready or not art.lora or not v.is_digest_pinned(art.uri):
            raise invalid_request(
                f"LoRA artifact {art.id} must be ready, flagged as LoRA and pinned by digest"
            )
        if "modelId" in a and await reads.model(a["modelId"], project) is None:
            raise invalid_request(f"LoRA model {a['modelId']} not found")
        owners.append(art.project_id)
        resolved.append({**a, "uri": art.uri})
    out["lora"] = {"adapters": resolved} if resolved else None
    return out, owners

def effective_resources(
    override: dict[str, str] | None, engine_resources: dict[str, Any] | None
) -> dict[str, tuple[str, str]]:
    """What the pods will request, per key, with where it comes from: the engine's catalog resources, each
    replaced by a non-empty value of the deployment's own (the merge workload.build_spec applies), so the caps
    hold for what reaches the cluster and not only for what the caller typed."""
    out = {k: (str(val), "engine") for k, val in (engine_resources or {}).items() if val not in (None, "")}
    out.update({k: (val, "deployment") for k, val in (override or {}).items() if val})
    return out


def visibility_scope(project: str, owners: list[str | None]) -> str:
    """All public or all this project's; anything else is refused."""
    if all(o is None for o in owners):
        return "public"
    if all(o == project for o in owners):
        return "project"
    raise invalid_request("engine, model and artifacts must all be public or all belong to this project")


def current_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The stored snapshot in request form, so an update re-validates the merged result."""
    cfg = {k: spec.get(k) for k in ("replicas", "image", "modelName", "command", "args", "env",
                                    "resources", "kvCacheOffloading")}
    if spec.get("lora"):
        cfg["lora"] = {"adapters": [{k: a[k] for k in ("name", "artifactId", "modelId") if k in a}
                                    for a in spec["lora"]["adapters"]]}
    return cfg
