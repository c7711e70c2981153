"""The gateway's own Deployment from k8s/overlays/cpu (rendered for the v1.20 API) on the real node, with the project's
image (docker/build_local.sh, imported by tools/testenv/node/images.sh) in all three of its containers: the init
container's model copy, the Triton container (`sr-gateway triton`) and the gateway. Deployed as a user of this small
node would: the overlay's objects, plus the user's own patch for 2 CPUs (smaller requests, one replica, no HPA: no
metrics adapter runs here) serving one model. Then the pod's probes, the kubelet's restarts and a rolling restart
meet a real kubelet, kube-proxy and Service."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from k8s.render import merge, render

from .conftest import busybox_pod, cluster_ip, default_account_token, imported, kubectl, pod_ready, wait_until

IMAGE = "docker.io/library/sr-gateway:0.1.0"
NAMESPACE = "sr-gateway-cpu"  # not the control plane test's `sr-gateway`, which may still be terminating
MODEL = "all-minilm-l6-v2"
SELECTOR = "app.kubernetes.io/name=sr-gateway"
# the user's patch for this node (2 CPUs, shared memory): what the overlay asks for would never be scheduled here
SMALL_NODE = yaml.safe_load(f"""
Deployment:
  spec:
    replicas: 1
    template:
      spec:
        containers:
          - name: triton
            resources: {{requests: {{cpu: 250m, memory: 1Gi}}}}
          - name: gateway
            resources: {{requests: {{cpu: 100m, memory: 256Mi}}}}
ConfigMap:
  data: {{SR_GATEWAY_MODELS: {MODEL}}}
""")
KINDS = {"ServiceAccount", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}


@dataclass
class Sample:
    """One look at the pod while it starts: its Ready condition, then the gateway's own /health."""

    ready: bool
    health_code: int | None
    health_status: str | None


def objects() -> list[dict[str, Any]]:
    """The overlay's gateway objects with the small-node patch merged as kustomize would (k8s.render.merge)."""
    docs = [d for d in render("cpu", namespace=NAMESPACE, older_apiserver=True)
            if d["metadata"]["name"] == "sr-gateway" and d["kind"] in KINDS]
    return [merge(d, SMALL_NODE[d["kind"]]) if d["kind"] in SMALL_NODE else d for d in docs]


@pytest.fixture(scope="module")
def deployed(core: client.CoreV1Api) -> Iterator[list[dict[str, Any]]]:
    """Applied with kubectl; not waited for (the first test watches the pod come up)."""
    if not imported(IMAGE):
        pytest.fail(f"{IMAGE} is not in the node's containerd: tools/testenv/node/images.sh RUN gateway")
    docs = objects()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    path = None
    try:
        # the busybox client pod (default ServiceAccount) is refused until the controller-manager gave it a token
        wait_until("default ServiceAccount token", lambda: default_account_token(core, NAMESPACE), timeout_s=60)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(docs, f)
            path = f.name
        done = kubectl("apply", "-f", path)
        assert done.returncode == 0, done.stderr
        yield docs
    finally:
        if path:
            os.unlink(path)
        core.delete_namespace(NAMESPACE, grace_period_seconds=0)


def gateway_pods(core: client.CoreV1Api) -> list[Any]:
    pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
    return [p for p in pods.items if not p.metadata.deletion_timestamp]


def the_pod(core: client.CoreV1Api) -> Any:
    (found,) = gateway_pods(core)
    return found


def restarts_of(found: Any, container: str) -> int:
    return next(s.restart_count for s in found.status.container_statuses or [] if s.name == container)


def get_json(url: str) -> tuple[int | None, Any]:
    """(status, body) of a GET; (None, None) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)
    except (OSError, ValueError):
        return None, None


def embed(url: str, text: str) -> tuple[int | str, list[float] | None]:
    """POST /v1/embeddings through `url` (a new connection each time, so kube-proxy's current rules pick the pod):
    its status and the vector, or why nothing came back."""
    body = json.dumps({"model": MODEL, "input": text}).encode()
    request = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)["data"][0]["embedding"]
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError as exc:
        return repr(exc), None


def pids(pod_name: str, container: str, comm: str) -> list[int]:
    """Processes named `comm` in a container (the image has no procps: /proc, through `kubectl exec`)."""
    script = f'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = {comm} ] && echo ${{p#/proc/}}; done; true'
    done = kubectl("-n", NAMESPACE, "exec", pod_name, "-c", container, "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    return [int(p) for p in done.stdout.split()]


def shm_regions(pod_name: str) -> set[str]:
    done = kubectl("-n", NAMESPACE, "exec", pod_name, "-c", "triton", "--", "ls", "/dev/shm")
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def answers(service: str) -> bool:
    status, vector = embed(service, "is the service answering?")
    return status == 200 and vector is not None


def test_the_gateway_pod_is_ready_only_after_its_golden_answers_pass_and_its_service_answers(
        api: client.ApiClient, core: client.CoreV1Api, deployed: list[dict[str, Any]]) -> None:
    samples: list[Sample] = []

    def look() -> bool:
        pods = gateway_pods(core)
        if len(pods) != 1 or not pods[0].status.pod_ip:
            return False
        ready = pod_ready(pods[0])  # first the condition, then /health: ready there cannot lag behind Ready here
        code, body = get_json(f"http://{pods[0].status.pod_ip}:8080/health")
        samples.append(Sample(ready, code, body.get("status") if isinstance(body, dict) else None))
        return ready

    # a deadline for a cold node (image unpacked, model repository copied, Triton started, MiniLM loaded, checked)
    wait_until("the gateway pod Ready", look, timeout_s=600, every_s=1)
    # the gateway answered while the pod was not Ready: it was loading or checking, and said so (and once ready,
    # the probes' periods may keep the pod un-Ready a few seconds more, never the other way round)
    waiting = [s for s in samples if not s.ready and s.health_code == 503]
    assert waiting and {s.health_status for s in waiting} <= {"starting", "loading", "warming"}, samples
    assert all(s.health_code == 200 and s.health_status == "ready" for s in samples if s.ready), samples
    found = the_pod(core)
    gateway = f"http://{found.status.pod_ip}:8080"
    code, health = get_json(gateway + "/health")
    assert code == 200 and health["status"] == "ready" and health["model"] == MODEL, health
    assert health["triton"]["mode"] == "external" and health["triton"]["live"], health
    _, models = get_json(gateway + "/v1/models")
    golden = models["data"][0]["golden"]
    assert models["models"] == [MODEL] and golden["status"] == "matched" and golden["matched"] == golden["checked"] > 0
    # the Triton container is the gateway image's `sr-gateway triton`, under the manifest's security context
    assert {c.name: c.image for c in found.spec.containers} == {"triton": "sr-gateway:0.1.0",
                                                                 "gateway": "sr-gateway:0.1.0"}
    for container in ("triton", "gateway"):
        done = kubectl("-n", NAMESPACE, "exec", found.metadata.name, "-c", container, "--", "id", "-u")
        assert done.stdout.strip() == "10001", done
    assert len(pids(found.metadata.name, "triton", "tritonserver")) == 1

    # through the Service (kube-proxy's rules) from this host ...
    service = f"http://{cluster_ip(core, NAMESPACE, 'sr-gateway')}"
    status, vector = embed(service, "a request through the Service")
    assert status == 200 and vector is not None and len(vector) == 384
    assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-3)  # MiniLM's output is normalised
    other = embed(service, "something else entirely")[1]
    assert other is not None and other != vector
    # ... and from another pod over the bridge (busybox's nc: a plain HTTP/1.0 request; stdin stays open until the
    # answer came, since nc half-closes at its end and the gateway takes that for a client gone, cancelling its work)
    utils.create_from_dict(api, busybox_pod("client", "sleep 3600"), namespace=NAMESPACE)
    wait_until("client Ready", lambda: pod_ready(core.read_namespaced_pod("client", NAMESPACE)))
    body = json.dumps({"model": MODEL, "input": "a request through the Service"})
    address = service.removeprefix("http://")
    request = (f"(printf 'POST /v1/embeddings HTTP/1.0\\r\\nContent-Type: application/json\\r\\n"
               f"Content-Length: {len(body)}\\r\\n\\r\\n%s' '{body}'; sleep 10) | nc -w 30 {address} 80")
    done = kubectl("-n", NAMESPACE, "exec", "client", "--", "sh", "-c", request)
    assert done.returncode == 0 and re.match(r"HTTP/1\.[01] 200 ", done.stdout), done
    from_pod = json.loads(re.split(r"\r?\n\r?\n", done.stdout, maxsplit=1)[1])["data"][0]["embedding"]  # text mode
    assert max(abs(a - b) for a, b in zip(from_pod, vector, strict=True)) < 1e-3


def ready_gateway(core: client.CoreV1Api) -> tuple[str, str, dict[str, int]]:
    """The Ready gateway pod's name, its Service's URL and each container's restart count so far."""
    found = wait_until("the gateway pod Ready", lambda: (p := gateway_pods(core)) and pod_ready(p[0]) and p[0],
                       timeout_s=600)
    service = f"http://{cluster_ip(core, NAMESPACE, 'sr-gateway')}"
    return found.metadata.name, service, {c: restarts_of(found, c) for c in ("triton", "gateway")}


def test_a_tritonserver_killed_inside_the_pod_is_healed_and_the_service_answers_again(
        core: client.CoreV1Api, deployed: list[dict[str, Any]]) -> None:
    name, service, before = ready_gateway(core)
    regions = shm_regions(name)
    assert regions, "the Python backend's shared memory is in the pod's /dev/shm"
    (triton,) = pids(name, "triton", "tritonserver")
    done = kubectl("-n", NAMESPACE, "exec", name, "-c", "triton", "--", "sh", "-c", f"kill -KILL {triton}")
    assert done.returncode == 0, done.stderr
    # `sr-gateway triton` exits with it, the kubelet starts the container again; the gateway (external mode) waits,
    # then loads the model into the new Triton and checks its golden answers again
    wait_until("the triton container restarted",
               lambda: restarts_of(the_pod(core), "triton") == before["triton"] + 1, timeout_s=120)
    wait_until("Ready again", lambda: pod_ready(the_pod(core)), timeout_s=300)
    assert wait_until("the Service answers again", lambda: answers(service), timeout_s=60)
    assert restarts_of(the_pod(core), "gateway") == before["gateway"]  # healed without replacing the gateway
    _, health = get_json(f"http://{the_pod(core).status.pod_ip}:8080/health")
    assert health["status"] == "ready" and health["triton"]["live"], health
    # the dead Triton's shared-memory regions are gone; the new one's are there
    after = shm_regions(name)
    assert after and not after & regions, (regions, after)


def test_a_gateway_stuck_in_a_stopped_state_is_restarted_by_its_liveness_probe(
        core: client.CoreV1Api, deployed: list[dict[str, Any]]) -> None:
    name, service, before = ready_gateway(core)
    # the gateway process (dumb-init is PID 1 and stays): stopped, not killed, so only the probes can tell
    (gateway,) = pids(name, "gateway", "sr-gateway")
    done = kubectl("-n", NAMESPACE, "exec", name, "-c", "gateway", "--", "sh", "-c", f"kill -STOP {gateway}")
    assert done.returncode == 0, done.stderr
    wait_until("not Ready while stopped", lambda: not pod_ready(the_pod(core)), timeout_s=60)
    # liveness: 3 failures 10 s apart; then the kill waits for the preStop and the grace period (SIGTERM stays
    # pending in a stopped process)
    wait_until("the gateway container restarted",
               lambda: restarts_of(the_pod(core), "gateway") == before["gateway"] + 1, timeout_s=300)
    # the kubelet's own record that the liveness probe (not the process: a stopped one cannot exit) failed; its
    # Events would say so too, but its spam filter (25 per pod, then one per 5 minutes) has dropped them by now
    log = Path(os.environ["SR_NODE_DIR"], "kubelet.log").read_text(errors="replace")
    assert re.search(rf'Liveness probe for "{re.escape(name)}_{NAMESPACE}\([0-9a-f-]+\):gateway" failed', log)
    wait_until("Ready again", lambda: pod_ready(the_pod(core)), timeout_s=300)
    assert wait_until("the Service answers again", lambda: answers(service), timeout_s=60)
    assert restarts_of(the_pod(core), "triton") == before["triton"]  # Triton kept running: only the gateway went


def test_a_rolling_restart_under_steady_load_through_the_service_loses_no_request(
        core: client.CoreV1Api, deployed: list[dict[str, Any]]) -> None:
    # maxSurge 1, maxUnavailable 0 (the base's): the new pod is Ready before the old one leaves the endpoints; the
    # old gateway's preStop pause and drain, with its Triton outliving both, finish what it was sent
    found = wait_until("the gateway pod Ready", lambda: (p := gateway_pods(core)) and pod_ready(p[0]) and p[0],
                       timeout_s=600)
    service = f"http://{cluster_ip(core, NAMESPACE, 'sr-gateway')}"
    outcomes: list[int | str] = []
    stop = threading.Event()

    def load() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            outcomes.append(embed(service, f"steady load, request {n}")[0])
            time.sleep(0.05)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        wait_until("load flowing", lambda: len(outcomes) > 20, timeout_s=60)
        assert kubectl("-n", NAMESPACE, "rollout", "restart", "deployment/sr-gateway").returncode == 0
        done = kubectl("-n", NAMESPACE, "rollout", "status", "deployment/sr-gateway", "--timeout=600s",
                       timeout_s=630)
        assert done.returncode == 0, done.stderr

        def old_pod_gone() -> bool:
            pods: Any = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR)
            return found.metadata.name not in {p.metadata.name for p in pods.items}

        wait_until("the old pod gone", old_pod_gone, timeout_s=180)
        served = len(outcomes)
        wait_until("load on the new pod", lambda: len(outcomes) > served + 20, timeout_s=60)
    finally:
        stop.set()
        worker.join()
    failures = [o for o in outcomes if o != 200]
    assert len(outcomes) > 100 and failures == [], (len(outcomes), failures[:5])
    assert the_pod(core).metadata.name != found.metadata.name

