"""The host state a node run changes, read the same way tools/testenv/node/hoststate.sh records it before up.sh
starts anything (hoststate/before in the run directory), so the tests can compare without trusting the scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path

IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle")
NODE_MOUNTS = ("/tmp/sr-node", "/var/lib/sr-gateway-node", "/run/netns", "/var/run/netns", "/run/containerd",
               "/var/lib/kubelet")


def recorded_sysctls(run: Path) -> dict[str, str]:
    lines = (run / "hoststate" / "before" / "sysctls").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.split("=", 1)[1])


def sysctl(key: str) -> str:
    return Path("/proc/sys", *key.split(".")).read_text().strip().replace("\t", " ")


def chains(ipt: str, table: str) -> set[str]:
    out = subprocess.run([ipt, "-w", "-t", table, "-S"], capture_output=True, text=True, check=True).stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith(("-N ", "-P "))}


def recorded_chains(run: Path, ipt: str, table: str) -> set[str]:
    return set((run / "hoststate" / "before" / f"{ipt}-{table}").read_text().split())


def node_mounts() -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted(p for p in points if p.startswith(NODE_MOUNTS))


def netns() -> set[str]:
    path = Path("/run/netns")
    return {p.name for p in path.iterdir()} if path.is_dir() else set()


def links() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir()}
