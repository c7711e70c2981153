"""The hardware that runs a model, as `meta.accelerator` and /v1/models name it: on a CPU its model name (as
/proc/cpuinfo has it) and the instruction set the served precision's kernels use there ("Intel Xeon ... (AMX
bf16)"); on a GPU that GPU's name. "cpu"/"cuda" is `device`; this says which one, so a client comparing timings
or numerics across workers can tell an AVX2 fp32 answer from an AMX bf16 one.

It is read once per model load (the instance kind and precision come from the config Triton loaded), and only
where the gateway can see the machine Triton runs on: a child tritonserver, or one on loopback (the k8s sidecar
in the same pod). A remote Triton's hardware is not visible from here, so it is the honest "unknown" rather than
this host's CPU or the tuner's record (which names where a choice was measured, not where it runs).
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from sr_backend.engines.host import Host, detect

UNKNOWN = "unknown"
NVIDIA_SMI_TIMEOUT_S = 5.0


def triton_is_local(triton_url: str) -> bool:
    """Whether Triton runs on this machine: a child (no URL) or an address on loopback."""
    if not triton_url:
        return True
    host = triton_url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cpu_isa(host: Host, precision: str) -> str:
    """The instruction set a precision's kernels use on this CPU (the best one it offers, which ONNX Runtime's MLAS,
    OpenVINO's and PyTorch's oneDNN all dispatch to), followed by the precision."""
    vector = "AVX-512" if host.has("avx512f") else "AVX2" if host.has("avx2") else "SSE"
    if precision == "bf16":
        unit = "AMX" if host.has("amx_bf16") else "AVX-512 BF16" if host.has("avx512_bf16") else f"{vector} emulated"
    elif precision == "int8":
        unit = ("AMX" if host.has("amx_int8") else "AVX-512 VNNI" if host.has("avx512_vnni")
                else "AVX-VNNI" if host.has("avx_vnni") else "AVX-512" if host.has("avx512bw") else vector)
    else:
        unit = vector
    return f"{unit} {precision}"


def gpu_names() -> dict[int, str]:
    """This machine's GPUs by index, as nvidia-smi names them ({} without nvidia-smi or a GPU)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[int, str] = {}
    for line in done.stdout.splitlines():
        index, _, name = line.partition(",")
        if index.strip().isdigit() and name.strip():
            out[int(index)] = name.strip()
    return out


def accelerator_of(config: Mapping[str, Any], precision: str, local: bool,
                   host: Callable[[], Host] = detect, gpus: Callable[[], dict[int, str]] = gpu_names) -> str:
    """What runs a loaded model (its Triton config's instance groups, the served precision): see the module."""
    groups = list(config.get("instance_group") or [])
    if not local or not groups:
        return UNKNOWN
    if any(str(g.get("kind", "")) == "KIND_GPU" for g in groups):
        found = gpus()
        wanted = sorted({int(i) for g in groups for i in g.get("gpus") or found})  # no `gpus`: Triton uses all
        if not wanted or any(i not in found for i in wanted):
            return UNKNOWN  # no GPU listed here, or an instance on one this machine does not list
        names = sorted({found[i] for i in wanted})
        where = ", ".join(f"GPU {i}" for i in wanted)
        return f"{' + '.join(names)} ({where}, {precision})"
    cpu = host()
    if cpu.model == UNKNOWN:
        return UNKNOWN
    return f"{cpu.model} ({cpu_isa(cpu, precision)})"
