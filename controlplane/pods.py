"""Pod views for ``GET /deployments/{id}/pods``: the display status follows ``kubectl get pods``.

Why kubectl's rules: operators already read "CrashLoopBackOff" or "Init:0/1" there, and the phase alone
("Running") hides a crash-looping container (the complaint in kserve#1859).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes import client


def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _terminated_reason(term: Any) -> str:
    if term.reason:
        return str(term.reason)
    if term.signal:
        return f"Signal:{term.signal}"
    return f"ExitCode:{term.exit_code}"


def display_status(pod: client.V1Pod) -> str:
    """kubectl's STATUS column: init progress, then the last container's waiting/terminated reason."""
    status = pod.status or client.V1PodStatus()
    reason = status.reason or status.phase or "Unknown"
    init_total = len((pod.spec.init_containers if pod.spec else None) or [])
    initializing = False
    for i, c in enumerate(status.init_container_statuses or []):
        state = c.state or client.V1ContainerState()
        if state.terminated is not None and state.terminated.exit_code == 0:
            continue
        initializing = True
        if state.terminated is not None:
            reason = "Init:" + _terminated_reason(state.terminated)
        elif state.waiting is not None and state.waiting.reason and state.waiting.reason != "PodInitializing":
            reason = "Init:" + str(state.waiting.reason)
        else:
            reason = f"Init:{i}/{init_total}"
        break
    if not initializing:
        has_running = False
        for c in reversed(status.container_statuses or []):
            state = c.state or client.V1ContainerState()
            if state.waiting is not None and state.waiting.reason:
                reason = str(state.waiting.reason)
            elif state.terminated is not None:
                reason = _terminated_reason(state.terminated)
            elif state.running is not None and c.ready:
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if pod.metadata and pod.metadata.deletion_timestamp:
        reason = "Terminating"
    return reason


def _name(pod: client.V1Pod) -> str:
    return str(pod.metadata.name) if pod.metadata and pod.metadata.name else ""


def _container_state(c: client.V1ContainerStatus) -> str | None:
    state = c.state
    if state is None:
        return None
    for name in ("running", "waiting", "terminated"):
        if getattr(state, name) is not None:
            return name
    return None


def pod_view(pod: client.V1Pod) -> dict[str, Any]:
    """One item of the pods response; empty optional fields are omitted."""
    status = pod.status or client.V1PodStatus()
    statuses = {c.name: c for c in status.container_statuses or []}
    containers = []
    for spec_c in (pod.spec.containers if pod.spec else None) or []:
        st = statuses.get(spec_c.name)
        item: dict[str, Any] = {
            "name": spec_c.name,
            "ready": bool(st.ready) if st else False,
            "restartCount": int(st.restart_count or 0) if st else 0,
        }
        image = (st.image if st else None) or spec_c.image
        if image:
            item["image"] = image
        if st and st.image_id:
            item["imageId"] = st.image_id
        if st and (state := _container_state(st)):
            item["state"] = state
        containers.append(item)
    out: dict[str, Any] = {
        "name": _name(pod),
        "phase": status.phase or "Unknown",
        "status": display_status(pod),
        "containers": containers,
    }
    if pod.spec and pod.spec.node_name:
        out["nodeName"] = pod.spec.node_name
    if started := _ts(status.start_time):
        out["startTime"] = started
    return out


def current_pods(pods: list[client.V1Pod]) -> list[dict[str, Any]]:
    """Pods that have not succeeded, sorted by name."""
    live = [p for p in pods if (p.status.phase if p.status else None) != "Succeeded"]
    return [pod_view(p) for p in sorted(live, key=_name)]
