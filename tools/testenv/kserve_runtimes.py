"""Prints the ServingRuntime CRD stand-in and the ClusterServingRuntimes k8s/base ships, as one YAML stream for
`kubectl apply -f -`: the stand-in KServe of the tests (tests/controlplane/conftest.py) resolves an
InferenceService's runtime on the test apiserver the way KServe does, so the runtime must be there as shipped,
not assumed.

    kserve_runtimes.py | kubectl apply -f -
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from k8s.render import render  # noqa: E402

OPS_CRDS = Path(__file__).resolve().parent / "ops-crds.yaml"
SERVING_RUNTIME_CRD = "servingruntimes.serving.kserve.io"


def documents() -> list[dict[str, object]]:
    """The namespaced ServingRuntime CRD (KServe looks there first), then every shipped ClusterServingRuntime."""
    crds = [d for d in yaml.safe_load_all(OPS_CRDS.read_text()) if d and d["metadata"]["name"] == SERVING_RUNTIME_CRD]
    return crds + [d for d in render("base") if d["kind"] == "ClusterServingRuntime"]


if __name__ == "__main__":
    yaml.safe_dump_all(documents(), sys.stdout, sort_keys=False)
