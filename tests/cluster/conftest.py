"""Fixtures over the real one-node cluster started by tools/testenv/node (kubelet + containerd + CNI bridge,
kube-proxy, controller-manager, scheduler, kube-apiserver). Run through ``make test-node``; without that cluster
these tests are skipped, unless ``SR_NODE_REQUIRE=1`` (set by the make target), which turns the skip into a failure.

``test_teardown.py`` runs after ``node/down.sh`` (``SR_NODE_TORN_DOWN`` names the kept run directory); every other
module runs while the node is up (``SR_NODE_DIR``).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

UP_ENV = ("SR_NODE_DIR", "KUBECONFIG", "SR_NODE_KUBECTL", "SR_NODE_NAME")
DOWN_ENV = ("SR_NODE_TORN_DOWN",)
BUSYBOX = "localhost/sr-node-busybox:1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (or, under make, fail) when the real node is missing: never test against fakes."""
    for item in items:
        if "tests/cluster" not in str(item.fspath):
            continue
        needed = DOWN_ENV if Path(str(item.fspath)).name == "test_teardown.py" else UP_ENV
        missing = [k for k in needed if not os.environ.get(k)]
        if not missing:
            continue
        if os.environ.get("SR_NODE_REQUIRE") == "1":
            raise pytest.UsageError(f"one-node cluster missing for {item.nodeid}: {', '.join(missing)}")
        item.add_marker(pytest.mark.skip(reason="needs tools/testenv/node (run `make test-node`)"))


def wait_until(what: str, probe: Callable[[], Any], timeout_s: float = 120.0, every_s: float = 0.5) -> Any:
    """Poll until ``probe`` returns something truthy. A deadline, not a speed claim: it only bounds a hung test."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def kubectl(*args: str, stdin: str | None = None, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """The kubectl built from the cluster's own source (v1.20), as admin: the tool a user of this cluster runs."""
    return subprocess.run([os.environ["SR_NODE_KUBECTL"], "--request-timeout=60s", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture(scope="session")
def api() -> client.ApiClient:
    return config.new_client_from_config(os.environ["KUBECONFIG"])


@pytest.fixture(scope="session")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace; deleted after, and its pods with it (the namespace controller runs here)."""
    name = f"node-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        # the ServiceAccount admission refuses pods until the controller-manager gave `default` its token (v1.20)
        wait_until("default ServiceAccount token", lambda: default_account_token(core, name), timeout_s=60)
        yield name
    finally:
        core.delete_namespace(name, grace_period_seconds=0)


def default_account_token(core: client.CoreV1Api, namespace: str) -> bool:
    accounts: Any = core.list_namespaced_service_account(namespace, field_selector="metadata.name=default")
    return any(a.secrets for a in accounts.items)


# The client's models type every field Optional; these read what a running cluster always fills in.
def pod(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    return core.read_namespaced_pod(name, namespace)


def pod_ready(obj: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (obj.status.conditions or []))


def ready(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    return pod_ready(pod(core, namespace, name))


def restarts(core: client.CoreV1Api, namespace: str, name: str) -> int:
    return sum(s.restart_count for s in pod(core, namespace, name).status.container_statuses or [])


def imported(image: str) -> bool:
    """The image is in the node's containerd (tools/testenv/node/images.sh put it there; nothing is pulled here)."""
    done = subprocess.run(["ctr", "--address", os.environ["SR_NODE_CONTAINERD"], "-n", "k8s.io", "images", "ls", "-q"],
                          capture_output=True, text=True, check=True)
    return image in done.stdout.split()


def cluster_ip(core: client.CoreV1Api, namespace: str, name: str) -> str:
    service: Any = core.read_namespaced_service(name, namespace)
    return str(service.spec.cluster_ip)


def quota_used(core: client.CoreV1Api, namespace: str, name: str = "sr-project") -> dict[str, str]:
    quota: Any = core.read_namespaced_resource_quota(name, namespace)
    return dict(quota.status.used or {}) if quota.status else {}


def busybox_pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    """A pod of the node's own busybox image (no registry is reachable here): a shell script as its one container."""
    container = {"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never", "command": ["/bin/busybox", "sh", "-c",
                                                                                            script]}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 2, **spec}}
