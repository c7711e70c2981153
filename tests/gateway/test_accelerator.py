"""`accelerator` names the hardware that runs a model (gateway.accelerator): a CPU's model and the instruction set
its served precision uses, a GPU's name, or "unknown" where the gateway cannot see the machine Triton runs on.
These cover the hosts this machine is not (AVX2-only, no VNNI, GPUs); the served stack's test names this host."""

from __future__ import annotations

import pytest

from gateway.accelerator import UNKNOWN, accelerator_of, cpu_isa, triton_is_local
from sr_backend.engines.host import Host

SAPPHIRE = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
            "amx_int8")
CPU_CONFIG = {"instance_group": [{"kind": "KIND_CPU", "count": 2}]}


def host(*flags: str, model: str = "Some CPU") -> Host:
    return Host(model, 2, 2000.0, flags)


@pytest.mark.parametrize(("flags", "precision", "isa"), [
    (SAPPHIRE, "bf16", "AMX bf16"),
    (SAPPHIRE, "int8", "AMX int8"),
    (SAPPHIRE, "fp32", "AVX-512 fp32"),
    (("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"), "bf16", "AVX-512 BF16 bf16"),
    (("avx2", "avx512f", "avx512bw", "avx512_vnni"), "int8", "AVX-512 VNNI int8"),
    (("avx2", "avx_vnni"), "int8", "AVX-VNNI int8"),
    (("avx2", "avx512f", "avx512bw"), "int8", "AVX-512 int8"),
    (("avx2", "fma"), "int8", "AVX2 int8"),
    (("avx2", "fma"), "fp32", "AVX2 fp32"),
    (("avx2", "fma"), "bf16", "AVX2 emulated bf16"),
    ((), "fp32", "SSE fp32"),
])
def test_a_cpu_names_the_best_instruction_set_its_flags_offer_for_the_served_precision(
        flags: tuple[str, ...], precision: str, isa: str) -> None:
    assert cpu_isa(host(*flags), precision) == isa


def test_a_local_cpu_model_is_named_with_its_isa_and_a_remote_triton_is_unknown() -> None:
    xeon = host(*SAPPHIRE, model="Intel(R) Xeon(R) Processor")
    assert accelerator_of(CPU_CONFIG, "bf16", True, host=lambda: xeon) == "Intel(R) Xeon(R) Processor (AMX bf16)"
    assert accelerator_of(CPU_CONFIG, "bf16", False, host=lambda: xeon) == UNKNOWN
    assert accelerator_of({}, "fp32", True, host=lambda: xeon) == UNKNOWN  # no instances read: not loaded
    assert accelerator_of(CPU_CONFIG, "fp32", True, host=lambda: host("avx2", model="unknown")) == UNKNOWN


def test_a_gpu_instance_names_the_gpus_it_was_given_and_a_gpu_this_machine_lacks_is_unknown() -> None:
    gpus = {0: "NVIDIA H200", 1: "NVIDIA L4"}
    on_one = {"instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [1]}]}
    on_all = {"instance_group": [{"kind": "KIND_GPU", "count": 1}]}
    assert accelerator_of(on_one, "fp16", True, gpus=lambda: gpus) == "NVIDIA L4 (GPU 1, fp16)"
    assert accelerator_of(on_all, "fp32", True, gpus=lambda: gpus) == "NVIDIA H200 + NVIDIA L4 (GPU 0, GPU 1, fp32)"
    assert accelerator_of(on_one, "fp16", True, gpus=lambda: {0: "NVIDIA H200"}) == UNKNOWN
    assert accelerator_of(on_all, "fp16", True, gpus=dict) == UNKNOWN  # no nvidia-smi here
    assert accelerator_of(on_one, "fp16", False, gpus=lambda: gpus) == UNKNOWN


@pytest.mark.parametrize(("url", "local"), [
    ("", True), ("127.0.0.1:8001", True), ("localhost:8001", True), ("[::1]:8001", True), ("127.0.0.2:1", True),
    ("10.0.0.7:8001", False), ("triton.default.svc:8001", False), ("[2001:db8::1]:8001", False),
])
def test_only_a_child_or_loopback_triton_counts_as_this_machine(url: str, local: bool) -> None:
    assert triton_is_local(url) is local
