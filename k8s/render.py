"""Render a kustomization (base, overlays/cpu, overlays/gpu, project) to one YAML stream, offline.

    python k8s/render.py cpu > sr-gateway.yaml          # or: gpu, base, project
    python k8s/render.py project --namespace team-a      # a project namespace: RoleBinding, NetworkPolicy, quota
    python k8s/render.py gpu --digests digests.json      # every image pinned by digest (name@sha256:...)

--digests (or SR_IMAGE_DIGESTS): a JSON object from image reference ("sr-gateway:0.1.0") or name ("sr-gateway") to
its digest ("sha256:..."), e.g. from your registry after the push; every image the target names must be in it, so a
production render cannot leave one on a mutable tag.

It implements the part of kustomize these files use (resources, namespace, images, configMapGenerator with
disableNameSuffixHash, strategic-merge patches by kind and name, lists of named items merged by name), so
`kubectl kustomize k8s/overlays/cpu` gives the same objects where kustomize is available.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
TARGETS = {"base": ROOT / "base", "cpu": ROOT / "overlays" / "cpu", "gpu": ROOT / "overlays" / "gpu",
           "project": ROOT / "project"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Namespace", "CustomResourceDefinition",
                  "ClusterServingRuntime"}
CONTROLPLANE_POD = {"app.kubernetes.io/name": "sr-controlplane"}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# For an older apiserver (the test environment's is 1.20): the same objects under the versions it serves.
OLDER_VERSIONS = {("autoscaling/v2", "HorizontalPodAutoscaler"): "autoscaling/v2beta2",
                  ("policy/v1", "PodDisruptionBudget"): "policy/v1beta1"}

Doc = dict[str, Any]


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize does it for these files: maps merge; lists of maps with `name` merge by name;
    other lists and scalars are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch
            and all(isinstance(i, dict) and "name" in i for i in base + patch)):
        out_list = [copy.deepcopy(i) for i in base]
        for item in patch:
            match = next((n for n, b in enumerate(out_list) if b["name"] == item["name"]), None)
            if match is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[match] = merge(out_list[match], item)
        return out_list
    return copy.deepcopy(patch)


def _key(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _image(ref: str, images: list[dict[str, str]]) -> str:
    name, _, tag = ref.partition(":")
    for rule in images:
        if rule["name"] == name:
            if rule.get("digest"):
                return f"{rule.get('newName', name)}@{rule['digest']}"
            return f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"
    return ref


def _map_images(node: Any, change: Any) -> None:
    """Apply `change` (reference -> reference) to every `image` field, in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                node[key] = change(value)
            else:
                _map_images(value, change)
    elif isinstance(node, list):
        for item in node:
            _map_images(item, change)


def _set_images(node: Any, images: list[dict[str, str]]) -> None:
    _map_images(node, lambda ref: _image(ref, images))


def pin_digests(docs: list[Doc], digests: Mapping[str, str]) -> None:
    """Replace every image reference by name@digest (a tag can be moved, a digest names one image); the digest is
    looked up by the full reference, then by the name. An image without one is an error, not left on its tag."""
    for key, digest in digests.items():
        if not DIGEST.fullmatch(digest):
            raise ValueError(f"digest of {key}: {digest!r} is not sha256:<64 hex digits>")
    missing: list[str] = []

    def pin(ref: str) -> str:
        if "@" in ref:
            return ref
        name = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
        digest = digests.get(ref) or digests.get(name)
        if digest is None:
            missing.append(ref)
            return ref
        return f"{name}@{digest}"

    _map_images(docs, pin)
    if missing:
        raise ValueError(f"no digest for {', '.join(sorted(set(missing)))}")


def build(directory: Path) -> list[Doc]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    docs: list[Doc] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        docs += build(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in spec.get("configMapGenerator", []):
        options = gen.get("options", {})
        if not options.get("disableNameSuffixHash"):
            raise SystemExit(f"{directory}: configMapGenerator {gen['name']} needs disableNameSuffixHash here")
        data = {Path(f).name: (directory / f).read_text() for f in gen.get("files", [])}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": gen["name"], "labels": dict(options.get("labels", {}))}, "data": data})
    for entry in spec.get("patches", []):
        patch = yaml.safe_load((directory / entry["path"]).read_text())
        index = next((n for n, d in enumerate(docs) if _key(d) == _key(patch)), None)
        if index is None:
            raise SystemExit(f"{directory}: patch {entry['path']} matches no {_key(patch)}")
        docs[index] = merge(docs[index], patch)
    if spec.get("images"):
        _set_images(docs, spec["images"])
    if spec.get("namespace"):
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = spec["namespace"]
    return docs


def bind_to(docs: list[Doc], namespace: str) -> None:
    """Point every binding at the control plane's ServiceAccount in `namespace`, and every NetworkPolicy peer that
    names the control plane's pods at that namespace."""
    for doc in docs:
        for subject in doc.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
        if doc["kind"] != "NetworkPolicy":
            continue
        for rule in doc["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if peer.get("podSelector", {}).get("matchLabels") == CONTROLPLANE_POD and "namespaceSelector" in peer:
                    peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}


def render(target: str, *, namespace: str | None = None, older_apiserver: bool = False,
           digests: Mapping[str, str] | None = None) -> list[Doc]:
    """The objects of a target; `namespace` overrides the install namespace (and the project binding's subject);
    `digests` pins every image by digest (pin_digests)."""
    docs = build(TARGETS[target])
    if namespace and target != "project":
        bind_to(docs, namespace)
    if digests is not None:
        pin_digests(docs, digests)
    for doc in docs:
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = namespace
        if older_apiserver:
            doc["apiVersion"] = OLDER_VERSIONS.get((doc["apiVersion"], doc["kind"]), doc["apiVersion"])
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--namespace", help="namespace of every namespaced object")
    parser.add_argument("--controlplane-namespace", default="sr-gateway",
                        help="project target: the namespace of the control plane's ServiceAccount")
    parser.add_argument("--json", action="store_true", help="a JSON list instead of a YAML stream")
    parser.add_argument("--digests", default=os.environ.get("SR_IMAGE_DIGESTS"),
                        help="JSON file: image reference or name -> sha256 digest; pins every image (env "
                             "SR_IMAGE_DIGESTS)")
    args = parser.parse_args(argv)
    digests = None
    if args.digests:
        digests = json.loads(Path(args.digests).read_text())
        if not isinstance(digests, dict):
            raise SystemExit(f"{args.digests}: not a JSON object of image -> digest")
    try:
        docs = render(args.target, namespace=args.namespace, digests=digests)
    except ValueError as exc:
        raise SystemExit(f"render: {exc}") from exc
    if args.target == "project":
        bind_to(docs, args.controlplane_namespace)
    if args.json:
        json.dump(docs, sys.stdout, indent=1)
    else:
        yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
