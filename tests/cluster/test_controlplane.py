"""The control plane's own Deployment from k8s/base (rendered for the v1.20 API) on the real node, with the project's
image (docker/build_local.sh, imported by tools/testenv/node/images.sh): its pods become Ready under the manifest's
security context, answer through their Service, and take the reconciler's Lease with their own ServiceAccount's
token and RBAC, through the in-cluster kubeconfig (https://kubernetes.default.svc: the node's DNS and kube-proxy).
The catalog is SQLite in the pod's /tmp here; Keystone and PostgreSQL are tests/controlplane's."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from k8s.render import render

from .conftest import cluster_ip, imported, kubectl, wait_until

IMAGE = "docker.io/library/sr-controlplane:0.1.0"
NAMESPACE = "sr-gateway"


@pytest.fixture(scope="module")
def controlplane(core: client.CoreV1Api) -> Iterator[list[dict[str, Any]]]:
    """k8s/base's control-plane objects applied with kubectl, plus the Secret an operator provides."""
    if not imported(IMAGE):
        pytest.fail(f"{IMAGE} is not in the node's containerd: tools/testenv/node/images.sh RUN controlplane")
    docs = [d for d in render("cpu", namespace=NAMESPACE, older_apiserver=True)
            if d["metadata"]["name"].startswith("sr-controlplane")
            and d["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
                              "Deployment", "Service"}]
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sr-controlplane", "namespace": NAMESPACE},
              "stringData": {"SR_CP_DATABASE_URL": "sqlite+aiosqlite:////tmp/catalog.db"}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all([secret, *docs], f)
    try:
        done = kubectl("apply", "-f", f.name)
        assert done.returncode == 0, done.stderr
        yield docs
    finally:
        os.unlink(f.name)
        for d in docs:
            if "namespace" not in d["metadata"]:
                kubectl("delete", d["kind"], d["metadata"]["name"], "--ignore-not-found")
        core.delete_namespace(NAMESPACE, grace_period_seconds=0)


def test_the_control_plane_deployment_becomes_available_and_answers_through_its_service(
        core: client.CoreV1Api, controlplane: list[dict[str, Any]]) -> None:
    apps = client.AppsV1Api(core.api_client)
    wanted = next(d for d in controlplane if d["kind"] == "Deployment")["spec"]["replicas"]

    def available() -> bool:
        deployment: Any = apps.read_namespaced_deployment("sr-controlplane", NAMESPACE)
        return bool((deployment.status.available_replicas or 0) == wanted)

    wait_until("replicas available", available, timeout_s=300)
    ip = cluster_ip(core, NAMESPACE, "sr-controlplane")
    done = subprocess.run(["curl", "-sf", "-m", "5", f"http://{ip}/healthz"], capture_output=True, text=True)
    assert done.returncode == 0 and '"ok"' in done.stdout, done


def test_its_pods_run_as_the_manifests_user_with_a_read_only_root(
        core: client.CoreV1Api, controlplane: list[dict[str, Any]]) -> None:
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=sr-controlplane")
    name = pods.items[0].metadata.name
    assert kubectl("-n", NAMESPACE, "exec", name, "--", "id", "-u").stdout.strip() == "10001"
    refused = kubectl("-n", NAMESPACE, "exec", name, "--", "touch", "/etc/x")
    assert refused.returncode != 0 and "Read-only file system" in refused.stdout + refused.stderr


def test_one_replica_takes_the_reconcilers_lease_with_its_own_service_account(
        core: client.CoreV1Api, controlplane: list[dict[str, Any]]) -> None:
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=sr-controlplane")
    assert {p.spec.service_account_name for p in pods.items} == {"sr-controlplane"}
    coordination = client.CoordinationV1Api(core.api_client)

    def holder() -> str | None:
        leases: Any = coordination.list_namespaced_lease(NAMESPACE)
        return next((lease.spec.holder_identity for lease in leases.items
                     if lease.metadata.name.startswith("sr-controlplane") and lease.spec.holder_identity), None)

    identity = wait_until("the Lease taken", holder, timeout_s=120)
    assert any(identity.startswith(p.metadata.name) for p in pods.items), identity


def test_a_rolling_restart_under_steady_load_loses_no_request(
        core: client.CoreV1Api, controlplane: list[dict[str, Any]]) -> None:
    # maxUnavailable 0, readiness, the preStop pause and the server's drain: every request during the rollout is
    # answered (a new connection each, so kube-proxy's current rules choose the pod)
    url = f"http://{cluster_ip(core, NAMESPACE, 'sr-controlplane')}/healthz"
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    outcomes.append(str(response.status))
            except (OSError, urllib.error.URLError) as exc:
                outcomes.append(repr(exc))
            time.sleep(0.05)

    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=sr-controlplane")
    before = {p.metadata.name for p in pods.items}
    worker = threading.Thread(target=load)
    worker.start()
    try:
        assert kubectl("-n", NAMESPACE, "rollout", "restart", "deployment/sr-controlplane").returncode == 0
        done = kubectl("-n", NAMESPACE, "rollout", "status", "deployment/sr-controlplane", "--timeout=300s",
                       timeout_s=330)
        assert done.returncode == 0, done.stderr

        def old_pods_gone() -> bool:
            now: Any = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=sr-controlplane")
            return not before & {p.metadata.name for p in now.items}

        wait_until("old pods gone", old_pods_gone, timeout_s=180)
    finally:
        stop.set()
        worker.join()
    failures = [o for o in outcomes if o != "200"]
    assert len(outcomes) > 100 and failures == [], (len(outcomes), failures[:5])
