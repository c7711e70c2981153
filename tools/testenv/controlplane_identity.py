"""The control plane's identity in the test apiserver, exactly as k8s/ deploys it: the ServiceAccount, ClusterRoles,
bindings and leader-election Role rendered from k8s/base, applied for real; a token for that ServiceAccount from the
TokenRequest API; and the in-cluster kubeconfig of k8s/base (tokenFile, no stored credential) pointed at the test
apiserver. The control-plane suite talks to Kubernetes with that kubeconfig only, so a verb missing from the
manifests fails the suite. Project namespaces get their RoleBinding from k8s/project (see `bind_project`).

    controlplane_identity.py ADMIN_KUBECONFIG OUT_DIR [--namespace sr-gateway] [--hours 12]

Writes OUT_DIR/controlplane.token and OUT_DIR/controlplane.kubeconfig.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from k8s.render import bind_to, render  # noqa: E402

NAME = "sr-controlplane"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
AUDIENCE = "https://kubernetes.default.svc"
FIELD_MANAGER = "sr-ops-tests"  # the manifests tests apply the same objects with this manager: no conflicts


def identity_objects(namespace: str) -> list[dict[str, Any]]:
    """The control plane's RBAC objects of k8s/base, installed in `namespace`."""
    return [d for d in render("base", namespace=namespace)
            if d["kind"] in RBAC_KINDS and d["metadata"]["name"].startswith(NAME)]


def project_binding(project_namespace: str, controlplane_namespace: str) -> list[dict[str, Any]]:
    """What k8s/project renders for one project namespace: the RoleBinding granting the workload verbs there."""
    docs = render("project", namespace=project_namespace)
    bind_to(docs, controlplane_namespace)
    return [d for d in docs if d["kind"] == "RoleBinding"]  # k8s/project's fence and quota are not the identity


def kubectl_apply(admin_kubeconfig: str, docs: list[dict[str, Any]]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(docs, f)
        f.flush()
        done = subprocess.run(["kubectl", "--kubeconfig", admin_kubeconfig, "--request-timeout=30s", "apply",
                               "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", f.name],
                              capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"applying the control plane's RBAC failed: {done.stderr}")


def mint_token(admin_kubeconfig: str, namespace: str, hours: float) -> str:
    """A bound token for the ServiceAccount (TokenRequest), as the kubelet would project into its pod."""
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(admin_kubeconfig))
    minted = api.create_namespaced_service_account_token(NAME, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=int(hours * 3600))))
    assert minted.status is not None and minted.status.token
    return str(minted.status.token)


def in_cluster_kubeconfig(namespace: str, server: str, ca_file: str, token_file: str) -> dict[str, Any]:
    """k8s/base's kubeconfig ConfigMap (the one the Deployment mounts), with the test apiserver's address and CA
    and the minted token's file in place of the pod's."""
    (configmap,) = [d for d in render("base", namespace=namespace)
                    if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{NAME}-kubeconfig"]
    kubeconfig: dict[str, Any] = yaml.safe_load(configmap["data"]["config"])
    (user,) = kubeconfig["users"]
    assert set(user["user"]) == {"tokenFile"}, "the in-cluster kubeconfig must carry no credential of its own"
    user["user"]["tokenFile"] = token_file
    kubeconfig["clusters"][0]["cluster"] = {"server": server, "certificate-authority": ca_file}
    return kubeconfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("admin_kubeconfig")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--namespace", default="sr-gateway", help="the control plane's install namespace")
    parser.add_argument("--hours", type=float, default=12.0, help="token lifetime")
    args = parser.parse_args(argv)
    admin = yaml.safe_load(Path(args.admin_kubeconfig).read_text())["clusters"][0]["cluster"]
    namespace_doc = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": args.namespace}}
    kubectl_apply(args.admin_kubeconfig, [namespace_doc, *identity_objects(args.namespace)])
    token_file = args.out_dir / "controlplane.token"
    token_file.write_text(mint_token(args.admin_kubeconfig, args.namespace, args.hours))
    token_file.chmod(0o600)
    kubeconfig = in_cluster_kubeconfig(args.namespace, admin["server"], admin["certificate-authority"],
                                       str(token_file))
    (args.out_dir / "controlplane.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
