"""After tools/testenv/node/down.sh: nothing of the node is left on the host. Runs in its own pytest session after
down.sh, with ``SR_NODE_TORN_DOWN`` naming the run directory down.sh kept (SR_NODE_KEEP_RUN=1) for this check; the
state before up.sh is in its hoststate/before."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .hoststate import IPTABLES, TABLES, chains, links, netns, node_mounts, recorded_chains, recorded_sysctls, sysctl


@pytest.fixture(scope="module")
def run() -> Path:
    return Path(os.environ["SR_NODE_TORN_DOWN"])


def test_no_process_of_the_node_is_left(run: Path) -> None:
    for line in (run / "pids").read_text().splitlines():
        name, pid = line.split()
        assert not Path(f"/proc/{pid}").exists() or name not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace"), f"{name} ({pid}) still runs"
    left = subprocess.run(["pgrep", "-af", str(run)], capture_output=True, text=True).stdout
    assert left == "", left  # containerd shims and pod processes name the run directory


def test_no_mount_network_namespace_or_link_of_the_node_is_left(run: Path) -> None:
    assert node_mounts() == []
    before = run / "hoststate" / "before"
    assert netns() <= set((before / "netns").read_text().split())
    assert links() <= set((before / "links").read_text().split())


def test_no_iptables_chain_of_the_node_is_left(run: Path) -> None:
    for ipt in IPTABLES:
        for table in TABLES:
            assert chains(ipt, table) == recorded_chains(run, ipt, table), (ipt, table)
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    assert "KUBE-" not in rules and "CNI-" not in rules


def test_every_kernel_setting_the_node_changed_is_back(run: Path) -> None:
    for key, value in recorded_sysctls(run).items():
        assert sysctl(key) == value, key


def test_no_pod_cgroup_is_left(run: Path) -> None:
    # a cgroup the kubelet made can only be removed once no process is in it: this also finds orphaned pod processes
    before = set((run / "hoststate" / "before" / "cgroups").read_text().split())
    assert {str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")} <= before


def test_no_pod_log_of_the_node_is_left(run: Path) -> None:
    before = set((run / "hoststate" / "before" / "podlogs").read_text().split())
    now = {str(p) for d in ("/var/log/pods", "/var/log/containers") for p in Path(d).glob("*")}
    assert now <= before


def test_no_directory_the_runtime_made_is_left(run: Path) -> None:
    before = set((run / "hoststate" / "before" / "dirs").read_text().split())
    made = {"/run/netns", "/run/containerd", "/var/lib/cni", "/var/log/pods", "/var/log/containers"} - before
    assert {d for d in made if Path(d).exists()} == set()
