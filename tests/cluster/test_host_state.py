"""While the node runs, it has changed the host (what test_teardown.py then checks is put back): the kubelet's
kernel settings, forwarding for the bridge, kube-proxy's and the kubelet's iptables chains, the pods' network
namespaces. If these were not changed, the teardown test would prove nothing."""

from __future__ import annotations

import os
from pathlib import Path

from .hoststate import chains, recorded_chains, recorded_sysctls, sysctl

# what kubelet 1.20 sets (pkg/kubelet/cm, setupKernelTunables) and the bridge and kube-proxy need
KUBELET_SETS = {"kernel.panic": "10", "kernel.panic_on_oops": "1", "vm.overcommit_memory": "1"}


def test_the_kubelet_and_kube_proxy_changed_what_teardown_must_put_back() -> None:
    run = Path(os.environ["SR_NODE_DIR"])
    before = recorded_sysctls(run)
    assert set(KUBELET_SETS) | {"net.ipv4.ip_forward"} <= set(before)
    for key, value in KUBELET_SETS.items():
        assert sysctl(key) == value, key
    assert sysctl("net.ipv4.ip_forward") == "1"
    added = chains("iptables", "nat") - recorded_chains(run, "iptables", "nat")
    assert {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"} <= added, added
