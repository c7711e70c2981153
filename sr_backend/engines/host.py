"""What this host's CPU offers, read from /proc/cpuinfo: the ISA flags that decide which kernels an engine can
use (AVX2, AVX-512, VNNI, native bf16, AMX) and a nominal peak per precision for the benchmark tables."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

# the flags that change which kernels run; the tuning cache is keyed by them
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
             "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class Host:
    model: str
    cores: int
    mhz: float
    flags: tuple[str, ...]  # the ISA_FLAGS this CPU has

    @property
    def key(self) -> str:
        """Hosts with the same CPU model, core count and ISA flags share tuning results."""
        text = f"{self.model}|{self.cores}|{','.join(self.flags)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 kernels in hardware (AVX512-BF16 or AMX); without them bf16 is emulated and slower than fp32."""
        return self.has("avx512_bf16") or self.has("amx_bf16")

    def fp32_flops_per_cycle(self) -> int:
        """Per core: two FMA pipes × lanes × 2 (multiply and add)."""
        return 2 * (16 if self.has("avx512f") else 8 if self.has("avx2") else 4) * 2

    def peak_gflops(self, precision: str) -> tuple[float, str]:
        """Nominal peak (GFLOP/s, or GOP/s for int8) over all cores at the reported clock, and how it is derived.
        Nominal: turbo, thermal limits and a shared (virtualised) host all move the real ceiling."""
        base = self.cores * self.mhz / 1000.0
        fp32 = self.fp32_flops_per_cycle()
        if precision == "bf16":
            if self.has("amx_bf16"):
                return base * 1024, f"{self.cores} cores × {self.mhz:.0f} MHz × 1024 bf16 FLOP/cycle (AMX TMUL)"
            if self.has("avx512_bf16"):
                return base * fp32 * 2, f"{self.cores} cores × {self.mhz:.0f} MHz × {fp32 * 2} (AVX512-BF16 dot)"
            return base * fp32, f"{self.cores} cores × {self.mhz:.0f} MHz × {fp32} (no native bf16: fp32 FMA)"
        if precision == "int8":
            if self.has("amx_int8"):
                return base * 2048, f"{self.cores} cores × {self.mhz:.0f} MHz × 2048 int8 OP/cycle (AMX TMUL)"
            if self.has("avx512_vnni") or self.has("avx_vnni"):
                return base * fp32 * 4, f"{self.cores} cores × {self.mhz:.0f} MHz × {fp32 * 4} (VNNI, 4 × fp32)"
            return base * fp32 * 2, (f"{self.cores} cores × {self.mhz:.0f} MHz × {fp32 * 2} "
                                     "(u8s8 multiply-add without VNNI, 2 × fp32)")
        return base * fp32, f"{self.cores} cores × {self.mhz:.0f} MHz × {fp32} fp32 FLOP/cycle (2 FMA pipes)"


def detect(cpuinfo: Path = Path("/proc/cpuinfo")) -> Host:
    model, mhz, flags = "unknown", 0.0, set[str]()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown":
                model = value.strip()
            elif key == "cpu MHz" and not mhz:
                mhz = float(value)
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Host(model, cores, mhz or 2000.0, tuple(f for f in ISA_FLAGS if f in flags))
