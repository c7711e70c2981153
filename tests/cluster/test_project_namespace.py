"""A project namespace as k8s/project makes it (`k8s/render.py project`): its LimitRange gives a container without
resources the defaults and refuses one over the maximum, its ResourceQuota refuses the workload that would go over
the namespace's share, and a pod inside both runs on the real node."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from k8s.render import render

from .conftest import busybox_pod, kubectl, pod, quota_used, ready, wait_until


@pytest.fixture
def project(core: client.CoreV1Api, namespace: str) -> str:
    """`namespace`, onboarded as an operator would: k8s/project rendered for it and applied with kubectl."""
    docs = render("project", namespace=namespace, older_apiserver=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump_all(docs, f)
    try:
        done = kubectl("apply", "-f", f.name)
    finally:
        os.unlink(f.name)
    assert done.returncode == 0, done.stderr
    assert {d["kind"] for d in docs} >= {"ResourceQuota", "LimitRange"}
    # the quota controller fills in `used` before the admission plugin counts against it
    wait_until("quota counted", lambda: "pods" in quota_used(core, namespace))
    return namespace


def sized(name: str, cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
    """A pod asking for ``cpu`` and ``memory``, as requests and limits (a request above the default limit would be
    refused as invalid before the LimitRange or the quota look at it)."""
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
    container: dict[str, Any] = {"resources": {"requests": requests, "limits": requests}} if requests else {}
    return busybox_pod(name, "sleep 3600", container=container)


def create(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> None:
    api: Any = core  # the client takes plain dicts as bodies too
    if body["kind"] == "Service":
        api.create_namespaced_service(namespace, body)
    else:
        api.create_namespaced_pod(namespace, body)


def refusal(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiException) as err:
        create(core, namespace, body)
    assert err.value.status == 403, err.value.body
    return str(err.value.body)


def test_a_container_without_resources_gets_the_defaults_and_runs_on_the_node(
        core: client.CoreV1Api, project: str) -> None:
    create(core, project, sized("plain"))
    resources = pod(core, project, "plain").spec.containers[0].resources
    assert resources.requests == {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}
    # a LimitRange `max` without a `default` is also the default limit: cpu 32 (no throttling on a smaller node)
    assert resources.limits == {"cpu": "32", "memory": "1Gi", "ephemeral-storage": "4Gi"}
    wait_until("plain Ready", lambda: ready(core, project, "plain"))
    used = wait_until("quota use", lambda: (u := quota_used(core, project)).get("pods") == "1" and u)
    assert used["requests.cpu"] == "100m" and used["requests.memory"] == "256Mi"


def test_a_container_over_the_limit_ranges_maximum_is_refused(core: client.CoreV1Api, project: str) -> None:
    assert "maximum memory usage per Container is 192Gi" in refusal(core, project, sized("huge", memory="200Gi"))
    assert "maximum cpu usage per Container is 32" in refusal(core, project, sized("greedy", cpu="33"))


def test_a_workload_over_the_namespaces_quota_is_refused(core: client.CoreV1Api, project: str) -> None:
    # 64 CPUs is the project's share: two pods of 32 take it all (they stay Pending on a 2-CPU node; admitted is
    # what counts), the next one asking for any CPU is refused
    create(core, project, sized("half-1", cpu="32"))
    create(core, project, sized("half-2", cpu="32"))
    wait_until("both counted", lambda: quota_used(core, project).get("requests.cpu") == "64")
    message = refusal(core, project, sized("one-more", cpu="1"))
    assert "exceeded quota: sr-project" in message and "requests.cpu" in message
    # and no NodePort: a project's endpoints stay inside the cluster
    nodeport = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "outside"},
                "spec": {"type": "NodePort", "selector": {"app": "x"}, "ports": [{"port": 80}]}}
    assert "services.nodeports" in refusal(core, project, nodeport)
