"""KServe workloads on Kubernetes through the official client, with every blocking call off the event loop.

The API server's answers are translated to the spec's codes here and nowhere else: 403 -> forbidden,
404 -> not_found, 409 -> conflict, 400/422 -> 422 invalid_request, transport failures and 5xx -> 502.
Updates are read-modify-replace carrying the ``metadata.uid`` recorded at creation, so a workload that
was deleted and recreated behind our back is a 409, never silently overwritten.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from controlplane.errors import (
    ApiError,
    backend_unavailable,
    conflict,
    forbidden,
    internal,
    not_found,
    unavailable,
    unprocessable,
)
from controlplane.telemetry import Telemetry

GROUP = "serving.kserve.io"
STOP_ANNOTATION = "serving.kserve.io/stop"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    """Where one KServe kind lives in the API, and how KServe labels its pods."""

    name: str
    version: str
    plural: str

    def pod_selector(self, workload: str) -> str:
        """Label selector for the pods KServe creates for ``workload``."""
        if self.name == "InferenceService":
            return f"serving.kserve.io/inferenceservice={workload}"
        # Only the model server pods: the router/scheduler pods KServe runs for an LLMInferenceService carry
        # the same name/part-of labels but another component (they must not appear in pods, logs, exec or
        # metrics, nor keep a stopped deployment "stopping").
        return (f"app.kubernetes.io/name={workload},app.kubernetes.io/part-of=llminferenceservice,"
                "kserve.io/component=workload")


KINDS: dict[str, Kind] = {
    "InferenceService": Kind("InferenceService", "v1beta1", "inferenceservices"),
    "LLMInferenceService": Kind("LLMInferenceService", "v1alpha1", "llminferenceservices"),
}

def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def translate(exc: BaseException, action: str) -> ApiError:
    """Map a client-side failure to the spec's status/code pair."""
    if isinstance(exc, ApiException):
        msg = f"{action}: {_message(exc)}"
        if exc.status in (401, 403):
            # Kubernetes' text names the control plane's ServiceAccount and its missing verbs: the log gets
            # it, the caller gets the spec's message.
            log.warning("Kubernetes refused %s: %s %s", action, exc.status, _message(exc))
            why = ": the project's namespace is being terminated" if "being terminated" in msg else ""
            return forbidden(f"Kubernetes 拒绝操作 (Kubernetes refused the operation): {action}{why}")
        if exc.status == 404:
            return not_found(msg)
        if exc.status == 409:
            return conflict(msg)
        if exc.status in (400, 422):
            return unprocessable(f"Kubernetes rejected the request: {msg}")
        if exc.status == 0 or exc.status >= 500:
            log.warning("Kubernetes API failed on %s: %s %s", action, exc.status, _message(exc))
            return backend_unavailable(f"Kubernetes API unavailable: {action}")
        return internal(f"{action} failed")
    if isinstance(exc, urllib3.exceptions.HTTPError | aiohttp.ClientError | OSError | TimeoutError):
        return backend_unavailable(f"Kubernetes API unavailable: {action}: {type(exc).__name__}")
    return internal(f"{action} failed")


TOKEN_REREAD_S = 60.0
"""How often a kubeconfig's ``tokenFile`` is read again (client-go: once a minute)."""


def _token_file(kubeconfig: str) -> str | None:
    """The current user's ``tokenFile`` (absolute), if the kubeconfig names one."""
    doc = yaml.safe_load(Path(kubeconfig).read_text()) or {}
    ctx_name = doc.get("current-context")
    ctx = next((c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == ctx_name), {})
    user = next((u.get("user") or {} for u in doc.get("users") or [] if u.get("name") == ctx.get("user")), {})
    path = user.get("tokenFile")
    if not path:
        return None
    return str(Path(kubeconfig).resolve().parent / path) if not Path(path).is_absolute() else str(path)


class _TokenFileReader:
    """``refresh_api_key_hook`` that reads the ServiceAccount token file again: the kubelet rotates the
    projected token (an hour by default) and the official client reads ``tokenFile`` only once, so every
    call would turn into 401 after the first rotation."""

    def __init__(self, path: str, every_s: float) -> None:
        self._path, self._every = path, every_s
        self._next = 0.0

    def __call__(self, cfg: client.Configuration) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        try:
            token = Path(self._path).read_text().strip()
        except OSError as exc:  # keep the last token; the next call tries again
            log.warning("cannot re-read the Kubernetes token file %s: %s", self._path, exc)
            return
        if token:
            cfg.api_key["BearerToken"] = f"Bearer {token}"
            self._next = now + self._every


class KubeBackend:
    """Thin async facade over ``CustomObjectsApi`` and ``CoreV1Api`` for one cluster."""

    def __init__(
        self, kubeconfig: str, timeout_s: float, telemetry: Telemetry | None = None, *,
        token_reread_s: float = TOKEN_REREAD_S,
    ) -> None:
        self._telemetry = telemetry
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        cfg.retries = 0  # an unreachable API must surface as 502 quickly, not after urllib3 retries
        if token_file := _token_file(kubeconfig):
            cfg.refresh_api_key_hook = _TokenFileReader(token_file, token_reread_s)  # type: ignore[assignment]
        self._api = client.ApiClient(cfg)
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._timeout = (min(3.0, timeout_s), timeout_s)
        self._cfg = cfg
        self._stream_http: aiohttp.ClientSession | None = None

    def close(self) -> None:
        """Close pooled connections."""
        self._api.close()

    async def aclose(self) -> None:
        """Close the async session used for log streams, then the pooled connections."""
        if self._stream_http is not None:
            await self._stream_http.close()
        self.close()

    def _stream_session(self) -> aiohttp.ClientSession:
        """An aiohttp session with the kubeconfig's TLS and credentials: streams stay on the event loop
        and end the moment the caller stops reading (no thread blocked in a socket read)."""
        if self._stream_http is None:
            cfg = self._cfg
            ctx: ssl.SSLContext | bool = False
            if cfg.verify_ssl:
                ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
                if cfg.cert_file:
                    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
            self._stream_http = aiohttp.ClientSession(
                base_url=cfg.host.rstrip("/") + "/",
                connector=aiohttp.TCPConnector(ssl=ctx),
                timeout=aiohttp.ClientTimeout(total=None, connect=min(3.0, self._timeout[1]),
                                              sock_connect=min(3.0, self._timeout[1])),
            )
        return self._stream_http

    def _auth_headers(self) -> dict[str, str]:
        """What the official client would send now (its refresh hook may have rotated the token)."""
        if self._cfg.refresh_api_key_hook is not None:
            self._cfg.refresh_api_key_hook(self._cfg)
        settings: dict[str, Any] = dict(self._cfg.auth_settings())
        return {
            str(s["key"]): str(s["value"]) for s in settings.values() if s.get("in") == "header" and s.get("value")
        }

    async def open_exec(
        self, namespace: str, pod: str, container: str | None, command: list[str]
    ) -> aiohttp.ClientWebSocketResponse:
        """A WebSocket to the pod's exec subresource (v4 channel protocol), stdin and a TTY attached."""
        params = [("command", c) for c in command]
        params += [("stdin", "true"), ("stdout", "true"), ("tty", "true")]
        if container:
            params.append(("container", container))
        try:
            return await self._stream_session().ws_connect(
                f"api/v1/namespaces/{namespace}/pods/{pod}/exec",
                params=params,
                protocols=("v4.channel.k8s.io",),
                headers=self._auth_headers(),
                heartbeat=30,
            )
        except aiohttp.WSServerHandshakeError as exc:
            refused = ApiException(status=exc.status, reason=exc.message)
            refused.body = json.dumps({"message": exc.message})
            raise translate(refused, "exec") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise translate(exc, "exec") from exc

    async def open_log(
        self, namespace: str, pod: str, container: str | None, follow: bool, tail_lines: int
    ) -> aiohttp.ClientResponse:
        """Start reading a container log through the apiserver; the caller must release the response."""
        params = {"tailLines": str(tail_lines)}
        if container:
            params["container"] = container
        if follow:
            params["follow"] = "true"
        try:
            resp = await self._stream_session().get(
                f"api/v1/namespaces/{namespace}/pods/{pod}/log", params=params, headers=self._auth_headers()
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise translate(exc, "read log") from exc
        if resp.status != 200:
            refused = ApiException(status=resp.status, reason=resp.reason)
            refused.body = await resp.text()
            resp.release()
            raise translate(refused, "read log")
        return resp

    async def _call(self, action: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs["_request_timeout"] = self._timeout
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:
            err = translate(exc, action)
            outcome = str(err.status)
            raise err from exc
        finally:
            if self._telemetry is not None:
                self._telemetry.kube.labels(action=action, outcome=outcome).observe(time.perf_counter() - started)

    async def _namespaced(self, namespace: str, action: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A call in one namespace. The control plane is bound per project namespace (k8s/project), so in a namespace
        that does not exist the apiserver refuses (403) before it looks; that is the spec's 404 all the same."""
        try:
            return await self._call(action, fn, *args)
        except ApiError as err:
            if err.status == 403 and await self._namespace_missing(namespace):
                raise not_found(f"{action}: namespace {namespace} does not exist") from err
            raise

    async def _namespace_missing(self, namespace: str) -> bool:
        """True only when the apiserver says the namespace is not there (k8s/base grants get on namespaces)."""
        try:
            await self._call("read namespace", self._core.read_namespace, namespace)
        except ApiError as err:
            return err.status == 404 and err.error == "not_found"
        return False

    async def ping(self) -> None:
        """Whether the apiserver answers (readiness); raises the translated error when it does not."""
        await self._call("read version", client.VersionApi(self._api).get_code)

    async def create(self, kind: Kind, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a workload; returns the stored object (with its uid)."""
        obj: dict[str, Any] = await self._namespaced(
            namespace,
            f"create {kind.name}",
            self._custom.create_namespaced_custom_object,
            GROUP,
            kind.version,
            namespace,
            kind.plural,
            body,
        )
        return obj

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        """Read a workload including its status."""
        obj: dict[str, Any] = await self._namespaced(
            namespace,
            f"read {kind.name}",
            self._custom.get_namespaced_custom_object,
            GROUP,
            kind.version,
            namespace,
            kind.plural,
            name,
        )
        return obj

    async def update(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        uid: str | None,
        mutate: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Read, apply ``mutate``, replace; the uid precondition turns a foreign object into a 409."""
        obj = await self.get(kind, namespace, name)
        mutate(obj)
        if uid:
            obj.setdefault("metadata", {})["uid"] = uid
        obj.pop("status", None)
        out: dict[str, Any] = await self._call(
            f"update {kind.name}",
            self._custom.replace_namespaced_custom_object,
            GROUP,
            kind.version,
            namespace,
            kind.plural,
            name,
            obj,
        )
        return out

    async def delete(self, kind: Kind, namespace: str, name: str, uid: str | None) -> bool:
        """Delete a workload; ``False`` when it was already gone (deleting twice is not an error)."""
        opts = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            propagation_policy="Background",
        )
        try:
            await self._call(
                f"delete {kind.name}",
                self._custom.delete_namespaced_custom_object,
                GROUP,
                kind.version,
                namespace,
                kind.plural,
                name,
                body=opts,
            )
        except ApiError as err:
            if err.status == 404 and err.error == "not_found":
                return False
            raise
        return True

    async def list_pods(self, kind: Kind, namespace: str, name: str) -> list[client.V1Pod]:
        """The workload's pods as KServe labels them."""
        pods = await self._call(
            "list pods", self._core.list_namespaced_pod, namespace, label_selector=kind.pod_selector(name)
        )
        return list(pods.items)

    async def count_live_pods(self, kind: Kind, namespace: str, name: str) -> int:
        """Pods of the workload that have not exited (used to tell stopping from stopped)."""
        pods = await self.list_pods(kind, namespace, name)
        phases = [p.status.phase if p.status else None for p in pods]
        return sum(1 for phase in phases if phase not in ("Succeeded", "Failed"))


def configured(kube: KubeBackend | None) -> KubeBackend:
    """The cluster client, or the spec's 503 ``unavailable`` when Kubernetes is not configured."""
    if kube is None:
        raise unavailable("Kubernetes is not configured")
    return kube


class ClusterView:
    """Cluster-wide reads and the coordination Lease, for the reconciler (same client, same translation)."""

    def __init__(self, kube: KubeBackend) -> None:
        self.kube = kube
        self._coord = client.CoordinationV1Api(kube._api)

    async def managed_workloads(self, kind: Kind, selector: str) -> list[dict[str, Any]]:
        """Every workload of ``kind`` in every namespace carrying the label ``selector``."""
        out = await self.kube._call(
            f"list {kind.name}", self.kube._custom.list_cluster_custom_object, GROUP, kind.version, kind.plural,
            label_selector=selector,
        )
        return list(out.get("items") or [])

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease as a plain dict, ``None`` when it does not exist yet."""
        try:
            lease = await self.kube._call("read lease", self._coord.read_namespaced_lease, name, namespace)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        out: dict[str, Any] = self.kube._api.sanitize_for_serialization(lease)
        return out

    async def write_lease(self, namespace: str, body: dict[str, Any]) -> None:
        """Create the Lease, or replace it under its resourceVersion (409 conflict when someone was faster)."""
        name = body["metadata"]["name"]
        if body["metadata"].get("resourceVersion"):
            await self.kube._call("update lease", self._coord.replace_namespaced_lease, name, namespace, body)
        else:
            await self.kube._call("create lease", self._coord.create_namespaced_lease, namespace, body)
