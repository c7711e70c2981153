"""The rendered manifests are safe on a shared cluster (issue 24): Triton's gRPC is unreachable from other pods, every
namespace denies ingress unless a NetworkPolicy says otherwise (evaluated here against the rendered pods' labels and
ports), a project namespace has a quota, the runtime the catalog names exists and is hardened, images are pinned,
and rollouts and drains keep capacity and drop no request.

These read the rendered YAML only; the apiserver dry-run of the same objects is test_rendered_manifests.py."""

from __future__ import annotations

import inspect
import json
import math
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity

from controlplane import app as controlplane_app
from controlplane.config import Settings
from controlplane.telemetry import Telemetry
from gateway.cli import build_parser, triton_process
from k8s.render import bind_to, main, render

ROOT = Path(__file__).resolve().parents[3]
CATALOG = yaml.safe_load((ROOT / "controlplane" / "catalog.yaml").read_text())
Doc = dict[str, Any]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def pod_spec(docs: list[Doc], name: str) -> Doc:
    spec: Doc = find(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc], deployment: str, name: str) -> Doc:
    return next(c for c in pod_spec(docs, deployment)["containers"] if c["name"] == name)


def flags(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


def triton_flags(triton: Doc) -> dict[str, str]:
    """The flags tritonserver gets: the container's args, or where it runs `sr-gateway triton` (the CPU overlay), the
    ones that command starts it with (the same parser and code that run in the pod)."""
    if triton.get("command", [])[-1:] == ["sr-gateway"]:
        return flags(triton_process(build_parser().parse_args(triton["args"])).arguments())
    return flags(triton["args"])


def images(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "image" and isinstance(v, str)] + [
            i for k, v in node.items() if k != "image" for i in images(v)]
    if isinstance(node, list):
        return [i for item in node for i in images(item)]
    return []


# -- Triton --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_tritons_grpc_listens_on_loopback_only_and_is_no_pod_or_service_port(target: str) -> None:
    docs = render(target)
    triton = container(docs, "sr-gateway", "triton")
    args = triton_flags(triton)
    assert args["--grpc-address"] == "127.0.0.1"
    assert args["--allow-http"] == "false" or args.get("--http-address") == "127.0.0.1"
    assert args["--model-control-mode"] == "explicit"  # why it matters: explicit control loads models on request
    grpc_port = int(args["--grpc-port"])
    for c in pod_spec(docs, "sr-gateway")["containers"]:
        assert grpc_port not in {p["containerPort"] for p in c.get("ports", [])}, c["name"]
    service_targets = {p["targetPort"] for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]}
    assert grpc_port not in service_targets and "triton-grpc" not in service_targets
    # the kubelet dials the pod IP: a tcpSocket/grpc probe of a loopback port would always fail
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert not {"tcpSocket", "grpc"} & set(triton.get(probe, {})), probe
    # its only client, in the same pod, dials loopback
    config = find(docs, "ConfigMap", "sr-gateway")["data"]
    assert config["SR_GATEWAY_TRITON_URL"] == f"127.0.0.1:{grpc_port}"


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_tritons_metrics_stay_on_their_own_scraped_port(target: str) -> None:
    docs = render(target)
    triton = container(docs, "sr-gateway", "triton")
    args = triton_flags(triton)
    assert args["--allow-metrics"] == "true" and args["--metrics-port"] != args["--grpc-port"]
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports["triton-metrics"] == int(args["--metrics-port"])
    monitor = find(docs, "ServiceMonitor", "sr-gateway")
    assert "triton-metrics" in {e["port"] for e in monitor["spec"]["endpoints"]}


def test_the_cpu_pods_triton_runs_the_gateway_image_with_the_bases_triton_settings() -> None:
    # no image built on NVIDIA's registry on CPU nodes; what Triton is told is what the base tells sr-triton
    cpu, base = render("cpu"), render("base")
    triton, gateway = container(cpu, "sr-gateway", "triton"), container(cpu, "sr-gateway", "gateway")
    assert triton["image"] == gateway["image"] == "sr-gateway:0.1.0" and triton["args"][0] == "triton"
    assert "sr-triton" not in " ".join(images(cpu))
    got, want = triton_flags(triton), flags(container(base, "sr-gateway", "triton")["args"])
    own = {"--backend-config"}  # the shm prefix is per process (`sr-gateway triton` cleans up a dead one's)
    assert {k: got.get(k) for k in want if k not in own} == {k: v for k, v in want.items() if k not in own}
    assert got["--backend-config"].startswith("python,shm-region-prefix-name=srgw-")
    # the Service's scrape port reaches it: metrics on every address, gRPC still on loopback only
    assert got["--metrics-address"] == "0.0.0.0" and got["--grpc-address"] == "127.0.0.1"


# -- NetworkPolicy ---------------------------------------------------------------------------------------------------


def selects(selector: Doc | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a label set; an empty selector selects all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


@dataclass
class Pod:
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)  # named container ports


@dataclass
class Cluster:
    """Namespaces (with their labels), pods, and every NetworkPolicy, as rendered."""

    namespaces: dict[str, dict[str, str]]
    policies: list[Doc]

    def _port_matches(self, rule_ports: list[Doc] | None, pod: Pod, port: int, protocol: str) -> bool:
        if not rule_ports:
            return True
        for p in rule_ports:
            number = pod.ports.get(p["port"]) if isinstance(p.get("port"), str) else p.get("port")
            if p.get("protocol", "TCP") == protocol and (p.get("port") is None or number == port):
                return True
        return False

    def _peer_matches(self, peer: Doc, policy_ns: str, other: Pod) -> bool:
        if "ipBlock" in peer:
            return True  # an ipBlock peer: these tests treat it as "anywhere"
        if "namespaceSelector" in peer:
            if not selects(peer["namespaceSelector"], self.namespaces[other.namespace]):
                return False
        elif other.namespace != policy_ns:
            return False
        return selects(peer.get("podSelector"), other.labels)

    def _allows(self, direction: str, subject: Pod, other: Pod, port: int, protocol: str, target: Pod) -> bool:
        """NetworkPolicy semantics: isolated when any policy of that direction selects the subject; then allowed
        when a rule of one of them matches the peer and the port."""
        kind, peers = ("Ingress", "from") if direction == "ingress" else ("Egress", "to")
        mine = [p for p in self.policies if p["metadata"]["namespace"] == subject.namespace
                and selects(p["spec"]["podSelector"], subject.labels)
                and kind in p["spec"].get("policyTypes", ["Ingress"])]
        if not mine:
            return True
        for policy in mine:
            for rule in policy["spec"].get(direction, []):
                if not self._port_matches(rule.get("ports"), target, port, protocol):
                    continue
                if not rule.get(peers) or any(self._peer_matches(peer, subject.namespace, other)
                                              for peer in rule[peers]):
                    return True
        return False

    def reaches(self, src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
        return (self._allows("egress", src, dst, port, protocol, dst)
                and self._allows("ingress", dst, src, port, protocol, dst))


def pod_of(docs: list[Doc], deployment: str, namespace: str) -> Pod:
    spec = find(docs, "Deployment", deployment)["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in spec["spec"]["containers"] for p in c.get("ports", [])
             if "name" in p}
    return Pod(namespace, dict(spec["metadata"]["labels"]), ports)


HOME = "sr-gateway"


@pytest.fixture(scope="module")
def cluster() -> tuple[Cluster, dict[str, Pod]]:
    """The base install in sr-gateway, two project namespaces rendered with `render.py project`, and the
    namespaces around them (labelled as the apiserver labels them, plus the worker-API opt-in on one)."""
    base = render("cpu")
    policies = [d for d in base if d["kind"] == "NetworkPolicy"]
    for project in ("team-a", "team-b"):
        docs = render("project", namespace=project)
        bind_to(docs, HOME)
        policies += [d for d in docs if d["kind"] == "NetworkPolicy"]
    names = [HOME, "team-a", "team-b", "monitoring", "ingress-nginx", "istio-system", "kube-system", "apps",
             "elsewhere"]
    namespaces = {n: {"kubernetes.io/metadata.name": n} for n in names}
    namespaces["apps"]["sr-gateway.io/worker-api"] = "allowed"
    workload = {"app.kubernetes.io/managed-by": "sr-controlplane", "sr-gateway.io/deployment-id": "d1",
                "serving.kserve.io/inferenceservice": "qwen"}
    pods = {
        "gateway": pod_of(base, "sr-gateway", HOME),
        "controlplane": pod_of(base, "sr-controlplane", HOME),
        "team-a workload": Pod("team-a", workload, {"http": 8080}),
        "team-a other": Pod("team-a", {"app": "tenant-code"}),
        "team-b workload": Pod("team-b", {**workload, "sr-gateway.io/deployment-id": "d2"}, {"http": 8080}),
        "worker-api caller": Pod("apps", {"app": "router"}),
        "prometheus": Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, {"web": 9090}),
        "ingress controller": Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
        "istio gateway": Pod("istio-system", {"istio": "ingressgateway"}),
        "kube-dns": Pod("kube-system", {"k8s-app": "kube-dns"}),
        "elsewhere": Pod("elsewhere", {"app": "anything"}, {"http": 8080}),
    }
    return Cluster(namespaces, policies), pods


def test_every_namespace_we_install_into_denies_ingress_by_default() -> None:
    for target, namespace in (("cpu", HOME), ("project", "team-a")):
        policies = [d for d in render(target, namespace=namespace) if d["kind"] == "NetworkPolicy"]
        deny = [p for p in policies if p["spec"]["podSelector"] == {} and p["spec"]["policyTypes"] == ["Ingress"]
                and not p["spec"].get("ingress")]
        assert deny, f"{target}: no default-deny ingress policy"
        assert all(p["metadata"]["namespace"] == namespace for p in policies)


def test_each_policy_selects_the_pods_it_is_for_and_names_ports_they_have() -> None:
    docs = render("cpu")
    templates = {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] == "Deployment"}
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        selector = policy["spec"]["podSelector"]
        chosen = [n for n, t in templates.items() if selects(selector, t["metadata"]["labels"])]
        if selector:  # a named policy is for the pods of its name, and only those
            assert chosen == [policy["metadata"]["name"]], (policy["metadata"]["name"], chosen)
        named = {p["name"] for n in chosen for c in templates[n]["spec"]["containers"] for p in c.get("ports", [])
                 if "name" in p}
        for rule in policy["spec"].get("ingress", []):
            for port in rule.get("ports", []):
                if isinstance(port["port"], str):
                    assert port["port"] in named, (policy["metadata"]["name"], port["port"], named)


REACH = [
    # (from, to, port, protocol, allowed)
    ("worker-api caller", "gateway", 8080, "TCP", True),
    ("team-a other", "gateway", 8080, "TCP", False),  # a tenant's own code: not a worker-API caller
    ("elsewhere", "gateway", 8080, "TCP", False),
    ("prometheus", "gateway", 8080, "TCP", True),  # /metrics
    ("prometheus", "gateway", 8002, "TCP", True),  # Triton's metrics
    ("worker-api caller", "gateway", 8002, "TCP", False),
    ("team-a other", "gateway", 8001, "TCP", False),
    ("ingress controller", "controlplane", 8090, "TCP", True),
    ("prometheus", "controlplane", 8090, "TCP", True),
    ("team-a other", "controlplane", 8090, "TCP", False),
    ("worker-api caller", "controlplane", 8090, "TCP", False),
    ("gateway", "controlplane", 8090, "TCP", False),
    ("team-a other", "team-a workload", 8080, "TCP", True),  # same namespace
    ("team-b workload", "team-a workload", 8080, "TCP", False),  # another tenant
    ("elsewhere", "team-a workload", 8080, "TCP", False),
    ("istio gateway", "team-a workload", 8080, "TCP", True),  # KServe's ingress path
    ("prometheus", "team-a workload", 8080, "TCP", True),
    ("controlplane", "team-a workload", 8080, "TCP", True),  # the api-schemas probe
    ("gateway", "team-a workload", 8080, "TCP", False),
    ("controlplane", "kube-dns", 53, "UDP", True),
    ("controlplane", "prometheus", 9090, "TCP", True),
    ("controlplane", "elsewhere", 8080, "TCP", False),  # no egress to pods it did not deploy
    ("controlplane", "elsewhere", 22, "TCP", False),
]


@pytest.mark.parametrize(("src", "dst", "port", "protocol", "allowed"), REACH,
                         ids=[f"{s}->{d}:{p}" for s, d, p, _, _ in REACH])
def test_network_policies_let_through_exactly_the_intended_callers(
        cluster: tuple[Cluster, dict[str, Pod]], src: str, dst: str, port: int, protocol: str, allowed: bool) -> None:
    net, pods = cluster
    assert net.reaches(pods[src], pods[dst], port, protocol) is allowed


def test_the_controlplane_egress_is_limited_to_its_dependencies_by_port(
        cluster: tuple[Cluster, dict[str, Pod]]) -> None:
    net, pods = cluster
    anywhere = Pod("elsewhere", {})
    for port in (443, 6443, 5000, 5432):  # apiserver, Keystone, PostgreSQL: addresses are the site's
        assert net._allows("egress", pods["controlplane"], anywhere, port, "TCP", anywhere), port
    for port in (25, 80, 3306, 8080, 9090):
        assert not net._allows("egress", pods["controlplane"], anywhere, port, "TCP", anywhere), port


def test_the_project_fence_lets_in_the_controlplane_of_the_namespace_it_was_rendered_for() -> None:
    out = render("project", namespace="team-a")
    bind_to(out, "platform")
    peers = [peer for d in out if d["kind"] == "NetworkPolicy" for r in d["spec"].get("ingress", [])
             for peer in r["from"] if peer.get("podSelector", {}).get("matchLabels")]
    assert peers == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "platform"}},
                      "podSelector": {"matchLabels": {"app.kubernetes.io/name": "sr-controlplane"}}}]


# -- a project's share ---------------------------------------------------------------------------------------------


def test_a_project_namespace_gets_a_resource_quota_and_a_limit_range() -> None:
    docs = render("project", namespace="team-a")
    quota = next(d for d in docs if d["kind"] == "ResourceQuota")["spec"]["hard"]
    assert {"requests.cpu", "requests.memory", "requests.nvidia.com/gpu", "pods"} <= set(quota)
    assert quota["services.loadbalancers"] == "0" and quota["services.nodeports"] == "0"
    limits = next(d for d in docs if d["kind"] == "LimitRange")["spec"]["limits"]
    per_container = next(lim for lim in limits if lim["type"] == "Container")
    assert {"cpu", "memory"} <= set(per_container["defaultRequest"])
    # the quota counts memory limits: a container without one must get a default, or its pod is refused
    if "limits.memory" in quota:
        assert "memory" in per_container["default"]
    assert {"cpu", "memory"} <= set(per_container["max"])


# -- KServe runtime --------------------------------------------------------------------------------------------------


def catalog_runtimes() -> set[str]:
    return {e["configName"] for e in CATALOG["engines"] if e["backend"] == "InferenceService"}


def test_the_runtime_the_catalog_names_ships_as_a_cluster_serving_runtime() -> None:
    docs = render("cpu", namespace="anywhere")
    runtimes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterServingRuntime"}
    assert catalog_runtimes() <= set(runtimes)
    for engine in (e for e in CATALOG["engines"] if e["backend"] == "InferenceService"):
        runtime = runtimes[engine["configName"]]
        assert "namespace" not in runtime["metadata"]  # cluster-scoped: found from every project namespace
        formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert (engine.get("modelFormat") or engine["runtime"]) in formats
    example = find(docs, "InferenceService", "sr-gateway-example")["spec"]["predictor"]["model"]
    assert example["runtime"] in runtimes


def test_the_cluster_serving_runtime_is_hardened_and_claims_only_the_protocol_it_serves() -> None:
    runtime = next(d for d in render("gpu") if d["kind"] == "ClusterServingRuntime")["spec"]
    assert runtime["protocolVersions"] == ["v1"]  # HTTP worker API on its port; Triton's gRPC is not exposed
    (c,) = runtime["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault"
    volumes = {v["name"]: v for v in runtime["volumes"]}
    shm = next(m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory"
    assert all(m["mountPath"] in ("/dev/shm", "/tmp") for m in c["volumeMounts"])  # the rest is read-only
    # the pod gets Kubernetes' default grace period (a runtime cannot set one): preStop + drain fit inside it
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(flags(c["args"])["--shutdown-s"])
    assert pre_stop + drain + 5 <= 30
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["timeoutSeconds"] >= 1


def test_the_cluster_serving_runtime_asks_for_what_the_gateway_pods_triton_and_gateway_ask_for_together() -> None:
    """Its one container runs both (`sr-gateway serve` with Triton as a child), serving the same models: the soak's
    numbers in k8s/base/gateway.yaml apply to it summed, and an edit to one file must not leave the other behind."""
    docs = render("base")
    (runtime,) = (d["spec"]["containers"][0]["resources"] for d in docs if d["kind"] == "ClusterServingRuntime")
    pod = [c["resources"] for c in pod_spec(docs, "sr-gateway")["containers"]]
    assert len(pod) == 2  # triton and gateway
    for part, resource in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
        assert parse_quantity(runtime[part][resource]) == sum(parse_quantity(c[part][resource]) for c in pod), \
            (part, resource)


@pytest.mark.parametrize("target", ["base", "cpu", "gpu"])
def test_no_image_is_latest_or_untagged(target: str) -> None:
    refs = images(render(target))
    assert refs
    for ref in refs:
        tag = ref.rsplit("/", 1)[-1].partition(":")[2]
        assert "@sha256:" in ref or (tag and tag != "latest"), ref


# -- images by digest ------------------------------------------------------------------------------------------------

DIGESTS = {"sr-gateway:0.1.0-gpu": "sha256:" + "1" * 64, "sr-triton": "sha256:" + "2" * 64,
           "sr-controlplane:0.1.0": "sha256:" + "3" * 64}


def test_render_pins_every_image_by_digest_and_refuses_one_it_has_no_digest_for(tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]
                                                                                 ) -> None:
    pinned = images(render("gpu", digests=DIGESTS))
    assert sorted(set(pinned)) == ["sr-controlplane@sha256:" + "3" * 64, "sr-gateway@sha256:" + "1" * 64,
                                   "sr-triton@sha256:" + "2" * 64]
    with pytest.raises(ValueError, match=re.escape("sr-gateway:0.1.0")):
        render("cpu", digests=DIGESTS)  # the cpu overlay's gateway is 0.1.0, not 0.1.0-gpu
    with pytest.raises(ValueError, match="not sha256"):
        render("gpu", digests={**DIGESTS, "sr-triton": "sha256:abc"})
    path = tmp_path / "digests.json"
    path.write_text(json.dumps(DIGESTS))
    assert main(["gpu", "--digests", str(path), "--json"]) == 0
    assert images(json.loads(capsys.readouterr().out)) == pinned
    with pytest.raises(SystemExit, match=re.escape("no digest for sr-gateway:0.1.0")):
        main(["cpu", "--digests", str(path)])


# -- rollouts, drains, probes --------------------------------------------------------------------------------------


def min_max_replicas(docs: list[Doc], deployment: str) -> tuple[int, int]:
    hpa = next((d for d in docs if d["kind"] == "HorizontalPodAutoscaler"
                and d["spec"]["scaleTargetRef"]["name"] == deployment), None)
    if hpa:
        return hpa["spec"].get("minReplicas", 1), hpa["spec"]["maxReplicas"]
    replicas = find(docs, "Deployment", deployment)["spec"].get("replicas", 1)
    return replicas, replicas


def test_a_deployment_the_hpa_scales_has_no_fixed_replica_count() -> None:
    docs = render("cpu")
    targets = [d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert targets
    for name in targets:
        assert "replicas" not in find(docs, "Deployment", name)["spec"], name


def test_every_deployment_has_a_pdb_that_allows_a_drain_and_keeps_all_but_one_replica() -> None:
    docs = render("cpu")
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        (pdb,) = [b for b in budgets if selects(b["spec"]["selector"], labels)]
        low, high = min_max_replicas(docs, name)
        for replicas in (low, high):
            spec = pdb["spec"]
            if "maxUnavailable" in spec:
                evictable = int(spec["maxUnavailable"])
            else:
                available = spec["minAvailable"]
                if isinstance(available, str):
                    available = math.ceil(replicas * int(available.rstrip("%")) / 100)
                evictable = replicas - int(available)
            assert evictable >= 1, f"{name}: at {replicas} replicas the PDB blocks every eviction"
            assert evictable <= max(1, replicas // 4), f"{name}: at {replicas} replicas a drain may take {evictable}"


def test_the_controlplane_replicas_spread_over_nodes() -> None:
    spec = pod_spec(render("cpu"), "sr-controlplane")
    anti = spec["affinity"]["podAntiAffinity"]
    terms = [t.get("podAffinityTerm", t) for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
             + anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    assert any(t["topologyKey"] == "kubernetes.io/hostname"
               and t["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": "sr-controlplane"} for t in terms)


def sleep_seconds(c: Doc) -> int:
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_triton_outlives_the_gateways_drain_inside_the_grace_period(target: str) -> None:
    docs = render(target)
    spec = pod_spec(docs, "sr-gateway")
    gateway, triton = container(docs, "sr-gateway", "gateway"), container(docs, "sr-gateway", "triton")
    drain = float(find(docs, "ConfigMap", "sr-gateway")["data"]["SR_GATEWAY_SHUTDOWN_S"])
    gateway_done = sleep_seconds(gateway) + drain
    assert sleep_seconds(triton) > gateway_done  # Triton gets SIGTERM only after the gateway has drained
    triton_done = sleep_seconds(triton) + int(triton_flags(triton)["--exit-timeout-secs"])
    assert spec["terminationGracePeriodSeconds"] >= triton_done


def readyz_check_timeout() -> float:
    """The per-dependency timeout inside /readyz, as controlplane/app.py has it: a literal, a module constant or a
    Settings field (its default)."""
    source = inspect.getsource(controlplane_app.readyz)
    found = re.search(r"wait_for\([^,]+,\s*([\w.\[\]]+)\s*\)", source)
    assert found, "readyz has no asyncio.wait_for(check, timeout): update this test"
    value = found.group(1)
    if re.fullmatch(r"[0-9.]+", value):
        return float(value)
    if hasattr(controlplane_app, value):
        return float(getattr(controlplane_app, value))
    return float(getattr(Settings, value.rsplit(".", 1)[-1]))


def test_the_controlplane_shuts_down_and_is_probed_within_its_own_timeouts() -> None:
    docs = render("cpu")
    spec = pod_spec(docs, "sr-controlplane")
    (c,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    shutdown = float(env.get("SR_CP_SHUTDOWN_TIMEOUT_S") or Settings.shutdown_timeout_s)  # `serve` passes it to aiohttp
    assert spec["terminationGracePeriodSeconds"] >= sleep_seconds(c) + shutdown
    assert c["readinessProbe"]["timeoutSeconds"] > readyz_check_timeout()
    assert c["livenessProbe"]["timeoutSeconds"] >= 1
    gateway = container(docs, "sr-gateway", "gateway")
    check = float(find(docs, "ConfigMap", "sr-gateway")["data"]["SR_GATEWAY_TRITON_CHECK_S"])
    assert gateway["readinessProbe"]["timeoutSeconds"] >= check


# -- monitoring ----------------------------------------------------------------------------------------------------


def test_a_service_monitor_scrapes_the_controlplane_service() -> None:
    docs = render("cpu")
    monitor = find(docs, "ServiceMonitor", "sr-controlplane")
    service = find(docs, "Service", "sr-controlplane")
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert all(e.get("path", "/metrics") == "/metrics" for e in monitor["spec"]["endpoints"])


def alert_rules() -> list[Doc]:
    rule = find(render("cpu"), "PrometheusRule", "sr-controlplane")
    rules: list[Doc] = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    return rules


def test_the_alerts_use_metrics_the_controlplane_exports() -> None:
    exported = {m.name for m in Telemetry().registry.collect()}
    exprs = " ".join(r["expr"] for r in alert_rules())
    used = set(re.findall(r"\bsr_cp_[a-z_]+", exprs))
    assert {"sr_cp_reconciler_lag_seconds", "sr_cp_reconciler_drift", "sr_cp_reconciler_leader"} <= used
    assert used <= exported, used - exported


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus) not installed")
def test_the_alerts_fire_on_reconciler_lag_and_drift_and_stay_quiet_when_healthy(tmp_path: Path) -> None:
    """promtool's rule unit tests: series as the control plane exports them, the alerts each one must raise."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": find(
        render("cpu"), "PrometheusRule", "sr-controlplane")["spec"]["groups"]}))
    series = {
        'up{job="sr-controlplane",pod="a"}': "1x40",
        'sr_cp_reconciler_leader{job="sr-controlplane",pod="a"}': "1x40",
        # healthy for 10 minutes, then no pass completes: lag grows by 60 s a minute
        'sr_cp_reconciler_lag_seconds{job="sr-controlplane",pod="a"}': "10x10 60+60x30",
        'sr_cp_reconciler_drift{job="sr-controlplane",pod="a",kind="workloads_without_record"}': "0x10 2x30",
        'sr_cp_reconciler_drift{job="sr-controlplane",pod="a",kind="records_without_workload"}': "0x40",
    }
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": k, "values": v} for k, v in series.items()],
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "SrControlplaneReconcilerLagging", "exp_alerts": []},
            {"eval_time": "9m", "alertname": "SrControlplaneReconcilerDrift", "exp_alerts": []},
            {"eval_time": "9m", "alertname": "SrControlplaneDown", "exp_alerts": []},
            {"eval_time": "9m", "alertname": "SrControlplaneNoReconcilerLeader", "exp_alerts": []},
            {"eval_time": "25m", "alertname": "SrControlplaneReconcilerLagging",
             "exp_alerts": [{"exp_labels": {"severity": "warning"},
                             "exp_annotations": {"summary": "The reconciler's leader has not completed a pass for "
                                                            "15m 0s."}}]},
            {"eval_time": "30m", "alertname": "SrControlplaneReconcilerDrift",
             "exp_alerts": [{"exp_labels": {"severity": "warning", "kind": "workloads_without_record"},
                             "exp_annotations": {"summary": "2 workloads_without_record for 15 minutes: the catalog "
                                                            "and the cluster disagree."}}]},
        ]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run([str(PROMTOOL), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
