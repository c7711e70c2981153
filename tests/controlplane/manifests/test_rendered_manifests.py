"""Every object `k8s/render.py` renders is applied with server-side dry-run to the real kube-apiserver, which
validates it (built-in schemas, CRD schemas, RBAC references); and the control plane's RBAC does what it claims:
workload verbs in the project namespaces it is bound to, nothing elsewhere, through its in-cluster kubeconfig."""

from __future__ import annotations

import asyncio
import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from controlplane.errors import ApiError as ControlPlaneError
from controlplane.kube import KINDS, KubeBackend
from k8s.render import render

from .conftest import kubectl


def dry_run(docs: list[dict[str, Any]], tmp_path: Path) -> tuple[int, str]:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    done = kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=sr-ops-tests",
                   "--validate=strict", "-f", str(path))
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("target", ["cpu", "gpu", "project"])
def test_every_rendered_object_is_accepted_by_the_apiserver(target: str, namespace: str, tmp_path: Path) -> None:
    # the test apiserver is 1.20: HPA and PDB go under the versions it serves (same fields), see k8s/render.py
    docs = render(target, namespace=namespace, older_apiserver=True)
    code, out = dry_run(docs, tmp_path)
    assert code == 0, out
    for doc in docs:
        assert f"/{doc['metadata']['name']} serverside-applied (server dry run)" in out, (doc["kind"], out)
    kinds = {d["kind"] for d in docs}
    if target == "project":
        assert {"RoleBinding", "NetworkPolicy", "ResourceQuota", "LimitRange"} <= kinds
    else:
        assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceMonitor",
                "PrometheusRule", "ClusterServingRuntime", "InferenceService", "ServiceAccount", "ClusterRole",
                "NetworkPolicy"} <= kinds
        cluster_wide = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
        for role in (d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] in cluster_wide):
            verbs = {v for rule in role["rules"] for v in rule["verbs"]}
            assert verbs <= {"get", "list", "watch"}, f"{role['metadata']['name']} grants {verbs} cluster-wide"


async def _as_the_controlplane(kubeconfig: str, project: str, other: str) -> None:
    """The control plane's own Kubernetes backend, with that kubeconfig: a workload's life in a project namespace,
    and a refusal elsewhere."""
    kube = KubeBackend(kubeconfig, 10.0)
    isvc = KINDS["InferenceService"]
    body = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "rbac-probe"}, "spec": {"predictor": {"model": {"modelFormat": {"name": "x"}}}}}
    try:
        created = await kube.create(isvc, project, body)
        assert (await kube.get(isvc, project, "rbac-probe"))["metadata"]["uid"] == created["metadata"]["uid"]
        assert await kube.list_pods(isvc, project, "rbac-probe") == []
        assert await kube.delete(isvc, project, "rbac-probe", created["metadata"]["uid"]) is True
        with pytest.raises(ControlPlaneError) as refused:
            await kube.create(isvc, other, body)
        assert refused.value.status == 403
    finally:
        await kube.aclose()


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_the_apiserver_rejects_a_broken_deployment_and_a_broken_service_monitor(namespace: str,
                                                                                tmp_path: Path) -> None:
    docs = render("cpu", namespace=namespace, older_apiserver=True)
    deployment = copy.deepcopy(_find(docs, "Deployment", "sr-gateway"))
    deployment["spec"]["template"]["spec"]["containers"][1]["livenessProbe"]["httpGet"]["port"] = 70000
    code, out = dry_run([deployment], tmp_path)
    assert code != 0 and "70000" in out, out
    monitor = copy.deepcopy(_find(docs, "ServiceMonitor", "sr-gateway"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    code, out = dry_run([monitor], tmp_path)
    assert code != 0 and "interval" in out, out


def _allowed(admin: client.ApiClient, user: str, namespace: str, verb: str, resource: str,
             group: str = "", subresource: str = "") -> bool:
    review = client.AuthorizationV1Api(admin).create_subject_access_review(client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=["system:serviceaccounts"], resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group=group, resource=resource, subresource=subresource))))
    assert review.status is not None
    return bool(review.status.allowed)


def test_the_controlplane_may_run_workloads_only_in_project_namespaces_bound_to_it(
        admin: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    core = client.CoreV1Api(admin)
    project, other = f"{namespace}-project", f"{namespace}-other"
    for ns in (project, other):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    # the control plane's own install namespace in this test env (its identity is shared with the suite: the
    # cluster-wide objects have one name, so installing them for another namespace would rebind them)
    home = os.environ["SR_TEST_CP_NAMESPACE"]
    try:
        docs = render("base", namespace=home)
        rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                 "RoleBinding")]
        # the project's RoleBinding only (k8s/project also renders its NetworkPolicies, quota and LimitRange)
        binding = [d for d in render("project", namespace=project) if d["kind"] == "RoleBinding"]
        for doc in binding:
            for subject in doc["subjects"]:
                subject["namespace"] = home
        path = tmp_path / "rbac.yaml"
        path.write_text(yaml.safe_dump_all(rbac + binding))
        done = kubectl("apply", "--server-side", "--field-manager=sr-ops-tests", "-f", str(path))
        assert done.returncode == 0, done.stderr
        user = f"system:serviceaccount:{home}:sr-controlplane"
        for verb in ("create", "get", "list", "watch", "patch", "delete"):
            assert _allowed(admin, user, project, verb, "inferenceservices", "serving.kserve.io")
        assert _allowed(admin, user, project, "get", "pods", subresource="log")
        assert _allowed(admin, user, project, "create", "pods", subresource="exec")
        assert not _allowed(admin, user, project, "get", "secrets")
        assert not _allowed(admin, user, other, "create", "pods", subresource="exec")
        for verb in ("create", "patch", "delete"):
            assert not _allowed(admin, user, other, verb, "inferenceservices", "serving.kserve.io")
        assert not _allowed(admin, user, "", "create", "pods", subresource="exec")  # cluster-wide
        # the reconciler reads its workloads everywhere, writes nowhere but in projects; its Lease is at home
        assert _allowed(admin, user, "", "list", "inferenceservices", "serving.kserve.io")
        assert not _allowed(admin, user, "", "delete", "inferenceservices", "serving.kserve.io")
        # it may ask whether a namespace exists (a refusal there is then a 404), not list or change them
        assert _allowed(admin, user, "", "get", "namespaces")
        assert not _allowed(admin, user, "", "list", "namespaces")
        assert not _allowed(admin, user, "", "delete", "namespaces")
        for verb in ("get", "create", "update"):
            assert _allowed(admin, user, home, verb, "leases", "coordination.k8s.io")
        assert not _allowed(admin, user, project, "update", "leases", "coordination.k8s.io")

        # its in-cluster kubeconfig (service-account token file, no stored credential) reaches the API with them
        kubeconfig = yaml.safe_load(_find(docs, "ConfigMap", "sr-controlplane-kubeconfig")["data"]["config"])
        minted = client.CoreV1Api(admin).create_namespaced_service_account_token(
            "sr-controlplane", home, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc"], expiration_seconds=600)))
        assert minted.status is not None
        (tmp_path / "token").write_text(str(minted.status.token))
        test_cluster = yaml.safe_load(Path(os.environ["SR_TEST_KUBE_ADMIN_KUBECONFIG"]).read_text())
        cluster = test_cluster["clusters"][0]["cluster"]
        assert kubeconfig["users"][0]["user"] == {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
        kubeconfig["users"][0]["user"]["tokenFile"] = str(tmp_path / "token")
        kubeconfig["clusters"][0]["cluster"] = {"server": cluster["server"],
                                                "certificate-authority": cluster["certificate-authority"]}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        custom = client.CustomObjectsApi(config.new_client_from_config(str(tmp_path / "kubeconfig")))
        found = custom.list_namespaced_custom_object("serving.kserve.io", "v1beta1", project, "inferenceservices")
        assert isinstance(found, dict) and found["items"] == []
        asyncio.run(_as_the_controlplane(str(tmp_path / "kubeconfig"), project, other))
    finally:
        for ns in (project, other):
            core.delete_namespace(ns)
