"""Real pods on the real node: readiness gates the Service, the kubelet heals a killed or hung process, and logs and
exec reach the kubelet through the API. The pods run the node's small busybox image (tools/testenv/node/images.sh);
the project's own images are tests/cluster/test_gateway.py's."""

from __future__ import annotations

import subprocess
import uuid
from functools import partial
from typing import Any

from kubernetes import client, utils

from .conftest import busybox_pod, cluster_ip, kubectl, pod, pod_ready, ready, restarts, wait_until

# The server waits before it listens: the pod runs but must not be Ready (nor in the Service) in that time.
SERVER = ("mkdir -p /www && echo \"hello from $HOSTNAME\" > /www/index.html && echo serving-soon && sleep {delay} "
          "&& echo serving && httpd -f -v -p 8080 -h /www & wait")
PROBE = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "failureThreshold": 1}


def create(api: client.ApiClient, namespace: str, *objects: dict[str, Any]) -> None:
    for obj in objects:
        utils.create_from_dict(api, obj, namespace=namespace)


def server(name: str, delay: int = 0, liveness: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"ports": [{"containerPort": 8080, "name": "http"}], "readinessProbe": PROBE}
    if liveness:
        container["livenessProbe"] = {**PROBE, "timeoutSeconds": 1, "failureThreshold": 2}
    return busybox_pod(name, SERVER.format(delay=delay), container=container)


def service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": "http"}]}}


def get_through(url: str) -> str | None:
    """GET from this host, through kube-proxy's rules: the answer's body, or None."""
    done = subprocess.run(["curl", "-sf", "-m", "2", url], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def test_a_pod_is_ready_and_in_its_service_only_once_its_readiness_probe_passes(
        api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    create(api, namespace, server("web", delay=6), service("web"))
    running = wait_until("container running", lambda: (p := pod(core, namespace, "web")).status.container_statuses
                         and p.status.container_statuses[0].state.running and p)
    # running, not yet listening: not Ready, and the Service has no address for it
    assert not pod_ready(running)
    endpoints: Any = core.read_namespaced_endpoints("web", namespace)
    assert not any(s.addresses for s in endpoints.subsets or [])
    wait_until("pod Ready", lambda: ready(core, namespace, "web"))
    assert pod(core, namespace, "web").status.pod_ip.startswith("10.244.0.")
    ip = cluster_ip(core, namespace, "web")
    body = wait_until("answer through the Service", lambda: get_through(f"http://{ip}/"), timeout_s=30)
    assert body.strip() == "hello from web"


def test_a_pod_reaches_another_through_its_service_and_exec_comes_from_the_kubelet(
        api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    create(api, namespace, server("web"), service("web"), busybox_pod("client", "sleep 3600"))
    for name in ("web", "client"):
        wait_until(f"{name} Ready", partial(ready, core, namespace, name))
    ip = cluster_ip(core, namespace, "web")
    # exec through the apiserver to the kubelet, then pod -> Service IP -> pod over the bridge (busybox's nc: its
    # static wget crashes looking up the "http" service without the libc's NSS modules)
    request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} 80"
    done = kubectl("-n", namespace, "exec", "client", "--", "sh", "-c", request)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("HTTP/1.") and done.stdout.splitlines()[-1] == "hello from web", done.stdout
    # and the exec ran in the pod's own namespaces: its hostname is the pod's
    assert kubectl("-n", namespace, "exec", "client", "--", "hostname").stdout.strip() == "client"


def test_container_logs_come_through_the_api_from_the_kubelet(
        api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    marker = uuid.uuid4().hex
    create(api, namespace, busybox_pod("talker", f"echo line-one-{marker}; echo line-two-{marker} >&2; sleep 3600"))
    wait_until("talker running", lambda: pod(core, namespace, "talker").status.phase == "Running")
    logs: str = wait_until("logs", lambda: (text := core.read_namespaced_pod_log("talker", namespace))
                           and text.count(marker) == 2 and text)
    # stdout and stderr are separate pipes: both lines come, in either order
    assert sorted(logs.splitlines()) == [f"line-one-{marker}", f"line-two-{marker}"]


def test_a_server_process_killed_inside_the_pod_is_restarted_and_the_service_answers_again(
        api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    create(api, namespace, server("web"), service("web"))
    wait_until("web Ready", lambda: ready(core, namespace, "web"))
    ip = cluster_ip(core, namespace, "web")
    assert wait_until("first answer", lambda: get_through(f"http://{ip}/"), timeout_s=30)
    assert restarts(core, namespace, "web") == 0
    done = kubectl("-n", namespace, "exec", "web", "--", "killall", "-KILL", "httpd")
    assert done.returncode == 0, done.stderr
    # the shell's `wait` returns, the container exits, the kubelet starts it again
    wait_until("restart", lambda: restarts(core, namespace, "web") >= 1)
    assert wait_until("answer after the restart", lambda: get_through(f"http://{ip}/"), timeout_s=60)


def test_a_hung_server_is_restarted_by_its_liveness_probe(
        api: client.ApiClient, core: client.CoreV1Api, namespace: str) -> None:
    create(api, namespace, server("web", liveness=True), service("web"))
    wait_until("web Ready", lambda: ready(core, namespace, "web"))
    # stopped, not killed: the process is there, the port accepts nothing; only the probe can tell
    done = kubectl("-n", namespace, "exec", "web", "--", "killall", "-STOP", "httpd")
    assert done.returncode == 0, done.stderr
    wait_until("not Ready while hung", lambda: not ready(core, namespace, "web"), timeout_s=30)
    wait_until("restart by liveness", lambda: restarts(core, namespace, "web") >= 1)
    events: Any = core.list_namespaced_event(namespace, field_selector="involvedObject.name=web")
    assert any(e.reason == "Unhealthy" and "Liveness probe failed" in (e.message or "") for e in events.items), \
        [(e.reason, e.message) for e in events.items]
    wait_until("Ready again", lambda: ready(core, namespace, "web"))
