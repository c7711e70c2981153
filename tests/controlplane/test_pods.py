"""GET /deployments/{id}/pods: what KServe's pods look like to an operator, and the endpoint's status codes."""

from __future__ import annotations

import pytest

from tests.controlplane.conftest import Api, Cluster, Project, triton, vllm

pytestmark = pytest.mark.asyncio
PODS = "/deployments/{id}/pods"
RUNNING = {"running": {"startedAt": "2026-09-21T00:04:00Z"}}


async def test_pods_are_sorted_by_name_with_kubectl_statuses_and_succeeded_pods_left_out(
    api: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("podded"))
    kind, ns = "LLMInferenceService", project.ns
    names = [await cluster.add_pod(kind, ns, "podded", i) for i in (3, 1, 2, 0)]
    await cluster.set_pod_status(ns, "podded-pod-0", {
        "phase": "Running", "startTime": "2026-09-21T00:04:00Z",
        "containerStatuses": [{"name": "main", "image": "example/main:1", "imageID": "example/main@sha256:1",
                               "ready": True, "restartCount": 0, "state": RUNNING}]})
    await cluster.set_pod_status(ns, "podded-pod-1", {
        "phase": "Running", "containerStatuses": [{
            "name": "main", "image": "example/main:1", "imageID": "", "ready": False, "restartCount": 7,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]})
    await cluster.set_pod_status(ns, "podded-pod-2", {
        "phase": "Succeeded", "containerStatuses": [{
            "name": "main", "image": "example/main:1", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]})
    # pod-3 stays Pending with no status from any kubelet
    _, body = await api.call("GET", PODS, project.member, expect=200, id=d["id"])
    assert [p["name"] for p in body["items"]] == ["podded-pod-0", "podded-pod-1", "podded-pod-3"]
    running, crashing, pending = body["items"]
    assert running == {
        "name": "podded-pod-0", "phase": "Running", "status": "Running", "nodeName": "fake-node-1",
        "startTime": "2026-09-21T00:04:00Z",
        "containers": [{"name": "main", "image": "example/main:1", "imageId": "example/main@sha256:1",
                        "ready": True, "restartCount": 0, "state": "running"}]}
    assert (crashing["phase"], crashing["status"]) == ("Running", "CrashLoopBackOff")
    assert crashing["containers"][0]["restartCount"] == 7 and crashing["containers"][0]["state"] == "waiting"
    assert (pending["phase"], pending["status"]) == ("Pending", "Pending")
    assert pending["containers"] == [{"name": "main", "image": "example/main:1", "ready": False,
                                      "restartCount": 0}]
    assert len(names) == 4


async def test_init_containers_show_as_init_progress(api: Api, project: Project, cluster: Cluster) -> None:
    d = await api.create(project.member, **triton("initing"))
    ns = project.ns
    body = {
        "metadata": {"name": "initing-pod", "labels": {"serving.kserve.io/inferenceservice": "initing"}},
        "spec": {"nodeName": "fake-node-1",
                 "initContainers": [{"name": "storage-initializer", "image": "kserve/storage-initializer:1"}],
                 "containers": [{"name": "kserve-container", "image": "tritonserver:1"}]},
    }
    await cluster.run(cluster.core.create_namespaced_pod, ns, body)
    await cluster.set_pod_status(ns, "initing-pod", {
        "phase": "Pending",
        "initContainerStatuses": [{"name": "storage-initializer", "image": "kserve/storage-initializer:1",
                                   "imageID": "", "ready": False, "restartCount": 0, "state": RUNNING}],
        "containerStatuses": [{"name": "kserve-container", "image": "tritonserver:1", "imageID": "",
                               "ready": False, "restartCount": 0,
                               "state": {"waiting": {"reason": "PodInitializing"}}}]})
    _, out = await api.call("GET", PODS, project.member, expect=200, id=d["id"])
    assert out["items"][0]["status"] == "Init:0/1"


async def test_a_deployment_without_pods_lists_none(api: Api, project: Project) -> None:
    d = await api.create(project.member, **vllm())
    _, body = await api.call("GET", PODS, project.member, expect=200, id=d["id"])
    assert body == {"items": []}


async def test_pods_status_codes(
    api: Api, api_nokube: Api, api_broken: Api, project: Project, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm())
    await api.call("GET", PODS, None, expect=401, id=d["id"])
    _, err = await api.call("GET", PODS, project.observer, expect=403, id=d["id"])
    assert err["error"] == "forbidden"
    await api.call("GET", PODS, project.reader, expect=200, id=d["id"])
    await api.call("GET", PODS, project.member, expect=404, id="deployment-nope")
    _, err = await api_nokube.call("GET", PODS, project.member, expect=503, id=d["id"])
    assert err["error"] == "unavailable"
    catalog_only = await api_nokube.create(project.member, **vllm())
    _, err = await api.call("GET", PODS, project.member, expect=422, id=catalog_only["id"])
    assert err["error"] == "invalid_backend"
    _, err = await api_broken.call("GET", PODS, project.member, expect=500, id=d["id"])
    assert err == {"error": "internal_error", "message": "listing the deployment's pods failed"}
    async with cluster.rbac_revoked():
        _, err = await api.call("GET", PODS, project.member, expect=403, id=d["id"])
        assert "Kubernetes refused" in err["message"]
    await cluster.delete("LLMInferenceService", project.ns, d["spec"]["k8sName"])
    _, err = await api.call("GET", PODS, project.member, expect=404, id=d["id"])
    assert err["error"] == "not_found"


async def test_admin_with_global_read_lists_another_projects_pods(
    api: Api, project: Project, admin_token: str, cluster: Cluster
) -> None:
    d = await api.create(project.member, **vllm("adm"))
    await cluster.add_pod("LLMInferenceService", project.ns, "adm")
    _, body = await api.call("GET", PODS, admin_token, expect=200, id=d["id"])
    assert [p["name"] for p in body["items"]] == ["adm-pod-0"]
