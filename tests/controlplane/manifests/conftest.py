"""The test environment's real kube-apiserver (tools/testenv), as admin, with the CRDs our manifests use.

The parent conftest skips these tests when the environment is missing (or fails them under `make`).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[3]
OPS_CRDS = ROOT / "tools" / "testenv" / "ops-crds.yaml"
# PrometheusRule (here), ClusterServingRuntime (k8s/crds, which tools/testenv applies too: applying it again is a no-op)
MORE_CRDS = [Path(__file__).with_name("crds.yaml"), ROOT / "k8s" / "crds" / "clusterservingruntimes.yaml"]


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", os.environ["SR_TEST_KUBE_ADMIN_KUBECONFIG"],
                           "--request-timeout=30s", *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="session")
def admin() -> client.ApiClient:
    """Admin API client, with the ServiceMonitor, PrometheusRule, ServingRuntime and ClusterServingRuntime CRDs
    installed and established."""
    for path in (OPS_CRDS, *MORE_CRDS):
        done = kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=sr-ops-tests", "-f", str(path))
        assert done.returncode == 0, done.stderr
    names = ["crd/servicemonitors.monitoring.coreos.com", "crd/servingruntimes.serving.kserve.io",
             "crd/prometheusrules.monitoring.coreos.com", "crd/clusterservingruntimes.serving.kserve.io"]
    ready = kubectl("wait", "--for=condition=established", "--timeout=60s", *names)
    assert ready.returncode == 0, ready.stderr
    return config.new_client_from_config(os.environ["SR_TEST_KUBE_ADMIN_KUBECONFIG"])


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    """A fresh namespace (deleted after; with no namespace controller it stays Terminating, harmlessly)."""
    core = client.CoreV1Api(admin)
    name = f"ops-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)
