"""Request validation for deployment create/update: field types and the spec's combination rules.

Everything here raises 400 ``invalid_request`` with a message naming the field, because that is the
only code the spec gives for "the configuration does not meet the requirements".
"""

from __future__ import annotations

import re
from typing import Any

from controlplane.config import Settings, quantity
from controlplane.errors import invalid_request

NAME_MAX = 255
QUANTITY_MAX = 64
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_URI_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
KV_TRANSFER_FLAG = "--kv-transfer-config"
EVICTION_POLICIES = ("lru", "arc")


def opt_str(body: dict[str, Any], key: str) -> str | None:
    """An optional string field; 400 when present with another type."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_request(f"{key} must be a string")
    return value


def display_name(value: Any) -> str:
    """Trimmed, non-empty display name."""
    if not isinstance(value, str) or not value.strip():
        raise invalid_request("name is required and must not be blank")
    if len(value) > NAME_MAX:  # the OpenAPI document's maxLength, on the value as sent
        raise invalid_request(f"name must be at most {NAME_MAX} characters")
    return value.strip()


def replicas(value: Any, *, strict: bool) -> int:
    """Create: missing or < 1 means 1. Update (``strict``): must be an integer >= 1."""
    if value is None and not strict:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request("replicas must be an integer")
    if strict and value < 1:
        raise invalid_request("replicas must be greater than or equal to 1")
    return max(1, value)


def str_list(value: Any, key: str) -> list[str]:
    """A list of strings (command, args)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise invalid_request(f"{key} must be an array of strings")
    return list(value)


def env_list(value: Any) -> list[dict[str, str]]:
    """``[{name, value}]`` with string name and value."""
    if not isinstance(value, list):
        raise invalid_request("env must be an array")
    out = []
    for item in value:
        if not isinstance(item, dict) or set(item) - {"name", "value"}:
            raise invalid_request("env items must be objects with name and value")
        name, val = item.get("name"), item.get("value")
        if not isinstance(name, str) or not name or not isinstance(val, str):
            raise invalid_request("env[].name and env[].value are required strings")
        out.append({"name": name, "value": val})
    return out


def resources(value: Any) -> dict[str, str] | None:
    """``{cpu, memory, gpu}`` quantities as strings; null or empty means no override."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"cpu", "memory", "gpu"}:
        raise invalid_request("resources may only contain cpu, memory and gpu")
    out: dict[str, str] = {}
    for key, val in value.items():
        if val is None or val == "":
            continue
        if not isinstance(val, str) or len(val) > QUANTITY_MAX:  # the OpenAPI document: strings, at most 64
            raise invalid_request(f"resources.{key} must be a string quantity of at most {QUANTITY_MAX} characters")
        if not _QUANTITY.match(str(val)) and not (key == "cpu" and re.match(r"^[0-9]+m$", str(val))):
            raise invalid_request(f"resources.{key} is not a Kubernetes quantity")
        out[key] = str(val)
    return out or None


# Label key prefixes a tenant must not set: they steer KServe (e.g. networking.kserve.io/visibility would
# expose the workload outside the cluster, without auth), Kubernetes, the mesh, or this control plane's own
# bookkeeping (which workload belongs to which deployment). A domain matches itself and its subdomains.
RESERVED_LABEL_DOMAINS = ("kserve.io", "kubernetes.io", "k8s.io", "istio.io", "sr-gateway.io")
# System-managed labels the spec lets a caller send (they are overwritten: "可能被补充或覆盖").
SYSTEM_LABELS = frozenset({"beacon.io/runtime"})


def is_reserved_label(key: str) -> bool:
    """Whether ``key``'s prefix is a reserved domain (``x.kserve.io/a``, ``kubernetes.io/a``, ...)."""
    if "/" not in key:
        return False
    prefix = key.split("/", 1)[0].lower()
    return any(prefix == d or prefix.endswith("." + d) for d in RESERVED_LABEL_DOMAINS)


def labels(value: Any) -> dict[str, str]:
    """String-to-string labels without reserved prefixes (Kubernetes itself validates the key syntax)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(x, str) for kv in value.items() for x in kv):
        raise invalid_request("labels must be an object of string keys and string values")
    reserved = sorted(k for k in value if is_reserved_label(k))
    if reserved:
        raise invalid_request(f"label {reserved[0]!r} uses a reserved prefix; labels under "
                              f"{', '.join(RESERVED_LABEL_DOMAINS)} are managed by the platform")
    return {k: val for k, val in value.items() if k not in SYSTEM_LABELS}


def oci_uri(value: str) -> str:
    """Complete a missing ``oci://`` prefix; other schemes are not deployable."""
    value = value.strip()
    if not value:
        raise invalid_request("modelUri must not be empty")
    if _URI_SCHEME.match(value):
        if not value.startswith("oci://"):
            raise invalid_request("modelUri must be an OCI URI (oci://...)")
        return value
    return "oci://" + value


def is_digest_pinned(uri: str) -> bool:
    """``oci://repo@sha256:<64 hex>``: the only LoRA reference that cannot change under us."""
    return uri.startswith("oci://") and bool(_DIGEST.search(uri))


def kv_cache_offloading(value: Any) -> dict[str, str] | None:
    """``{cpu, evictionPolicy}``; cpu a positive memory quantity, policy lru (default) or arc."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"cpu", "evictionPolicy"}:
        raise invalid_request("kvCacheOffloading may only contain cpu and evictionPolicy")
    cpu = value.get("cpu")
    m = _QUANTITY.match(cpu) if isinstance(cpu, str) else None
    if not isinstance(cpu, str) or m is None or float(m.group(1)) <= 0:
        raise invalid_request("kvCacheOffloading.cpu must be a positive memory quantity such as 8Gi")
    policy = value.get("evictionPolicy") or "lru"
    if policy not in EVICTION_POLICIES:
        raise invalid_request("kvCacheOffloading.evictionPolicy must be lru or arc")
    return {"cpu": cpu, "evictionPolicy": policy}


def lora_request(value: Any) -> list[dict[str, str]]:
    """Adapters as given (name, artifactId, optional modelId); names unique. Resolution happens later."""
    if value is None:
        return []
    if not isinstance(value, dict) or set(value) - {"adapters"}:
        raise invalid_request("lora must be an object with adapters")
    adapters = value.get("adapters") or []
    if not isinstance(adapters, list):
        raise invalid_request("lora.adapters must be an array")
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for a in adapters:
        if not isinstance(a, dict) or set(a) - {"name", "modelId", "artifactId"}:
            raise invalid_request("lora.adapters items must contain name, artifactId and optional modelId")
        name, art = a.get("name"), a.get("artifactId")
        if not isinstance(name, str) or not name.strip() or not isinstance(art, str) or not art:
            raise invalid_request("lora.adapters[].name and lora.adapters[].artifactId are required")
        if a.get("modelId") is not None and not isinstance(a["modelId"], str):
            raise invalid_request("lora.adapters[].modelId must be a string")
        if name in seen:
            raise invalid_request(f"duplicate LoRA adapter name {name!r}")
        seen.add(name)
        item: dict[str, str] = {"name": name, "artifactId": art}
        if isinstance(a.get("modelId"), str) and a["modelId"]:
            item["modelId"] = a["modelId"]
        out.append(item)
    return out


def mentions_kv_transfer(*sources: Any) -> bool:
    """Whether a manual ``--kv-transfer-config`` appears in command, args, env values or engine YAML."""
    for src in sources:
        if src is None:
            continue
        if isinstance(src, str):
            if KV_TRANSFER_FLAG in src:
                return True
        elif isinstance(src, list):
            for item in src:
                text = item.get("value", "") if isinstance(item, dict) else str(item)
                if KV_TRANSFER_FLAG in str(text):
                    return True
    return False


def has_accelerator(override: dict[str, str] | None, engine_resources: dict[str, Any] | None) -> bool:
    """A non-empty deployment ``resources.gpu`` wins over the engine's accelerator setting."""
    gpu = (override or {}).get("gpu") or (engine_resources or {}).get("gpu")
    return bool(gpu) and str(gpu) not in ("0", "0.0")


def within_limits(
    replica_count: int, res: dict[str, tuple[str, str]], limits: Settings, *, engine_id: str
) -> None:
    """The operator's caps on one deployment (replicas, CPU, memory, GPUs): a shared cluster must not let one
    tenant request all of it. ``res`` maps each resource to (quantity, "engine" or "deployment"): a catalog
    engine's resources reach the pods unless overridden, so they are capped too. 400 naming the field and the
    cap, and the engine when the value is its."""
    if replica_count > limits.max_replicas:
        raise invalid_request(f"replicas must be at most {limits.max_replicas}")
    for key, cap in (("cpu", limits.max_cpu), ("memory", limits.max_memory), ("gpu", str(limits.max_gpu))):
        if key not in res:
            continue
        value, source = res[key]
        asked, most = quantity(value), quantity(cap)
        if asked is not None and most is not None and asked > most:
            whose = (f" (engine {engine_id} asks for {value}; request less in resources.{key})"
                     if source == "engine" else "")
            raise invalid_request(f"resources.{key} must be at most {cap}{whose}")
