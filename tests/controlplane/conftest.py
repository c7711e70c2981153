"""Fixtures over the real test environment started by tools/testenv (kube-apiserver + etcd, Keystone,
PostgreSQL). Run through ``make test-controlplane``; without that environment these tests are skipped,
unless ``SR_CP_REQUIRE_TESTENV=1`` (set by the make target), which turns the skip into a failure. A module
with ``NEEDS_TESTENV = False`` runs either way (test_store_records: pure logic and the store on SQLite).

The catalog backend is chosen by ``SR_CP_TEST_DB`` (``sqlite`` or ``postgresql``); the make target runs
the whole suite once per backend.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import sqlalchemy as sa
import yaml
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from controlplane.app import create_app
from controlplane.catalog import import_catalog
from controlplane.config import Settings
from controlplane.db import make_engine, migrate
from k8s.render import bind_to, render

REQUIRED_ENV = (
    "SR_TEST_KUBE_ADMIN_KUBECONFIG",
    "SR_TEST_KUBE_CP_KUBECONFIG",
    "SR_TEST_CP_NAMESPACE",
    "SR_TEST_APISERVER_CTL",
    "SR_TEST_KEYSTONE_URL",
    "SR_TEST_KEYSTONE_ADMIN_PASSWORD",
    "SR_TEST_PG_DSN",
)
OPENAPI = yaml.safe_load((Path(__file__).parents[2] / "controlplane" / "openapi.yaml").read_text())
DIGEST = "sha256:" + "ab" * 32
GROUP = "serving.kserve.io"
TOKEN_TTL_S = 30.0
SHORT_TOKEN_TTL_S = 1.0
PROBE_TIMEOUT_S = 1.0


def _needs_testenv(item: pytest.Item) -> bool:
    """Every control-plane test needs the real environment, except those of a module that declares
    ``NEEDS_TESTENV = False`` (pure logic, or the store on a local SQLite file)."""
    module = getattr(item, "module", None)
    return "tests/controlplane" in str(item.fspath) and getattr(module, "NEEDS_TESTENV", True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip (or, under make, fail) when the real environment is missing: never test against fakes."""
    missing = [k for k in REQUIRED_ENV if not os.environ.get(k)]
    needing = [item for item in items if _needs_testenv(item)]
    if not missing or not needing:
        return
    if os.environ.get("SR_CP_REQUIRE_TESTENV") == "1":
        raise pytest.UsageError(f"controlplane test environment missing: {', '.join(missing)}")
    mark = pytest.mark.skip(reason="needs tools/testenv (run `make test-controlplane`)")
    for item in needing:
        item.add_marker(mark)


# -- OpenAPI response validation -------------------------------------------------------------------------


def _response_schema(path: str, method: str, status: int) -> dict[str, Any] | None:
    op = OPENAPI["paths"][path][method.lower()]
    resp = op["responses"].get(str(status))
    assert resp is not None, f"{method} {path} returned {status}, which the OpenAPI document does not declare"
    if "$ref" in resp:
        resp = OPENAPI["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    content = resp.get("content")
    if not content:
        return None
    return {**content["application/json"]["schema"], "components": OPENAPI["components"]}


def validate_response(path: str, method: str, status: int, body: Any) -> None:
    """Fail unless ``body`` matches what controlplane/openapi.yaml declares for this status."""
    schema = _response_schema(path, method, status)
    if schema is None:
        assert body is None, f"{method} {path} {status} must have no body"
        return
    errors = sorted(Draft202012Validator(schema).iter_errors(body), key=str)
    assert not errors, f"{method} {path} {status}: {[e.message for e in errors][:3]}"


@dataclass
class Api:
    """Calls the app and validates every response against the OpenAPI document."""

    http: TestClient[Any, Any]

    async def call(
        self,
        method: str,
        path: str,
        token: str | None,
        *,
        json: Any = None,
        data: str | None = None,
        expect: int | None = None,
        **path_args: str,
    ) -> tuple[int, Any]:
        headers = {"x-keystone-token": token} if token else {}
        kwargs: dict[str, Any] = {"headers": headers}
        if data is not None:
            kwargs["data"] = data
            headers["Content-Type"] = "application/json"
        elif json is not None:
            kwargs["json"] = json
        async with self.http.request(method, "/api/v1" + path.format(**path_args), **kwargs) as resp:
            raw = await resp.read()
            body = None if resp.status == 204 else await resp.json()
            assert resp.status != 204 or raw == b""
        validate_response(path.split("?", 1)[0], method, resp.status, body)
        if expect is not None:
            assert resp.status == expect, f"{method} {path}: {resp.status} {body}"
        return resp.status, body

    async def create(self, token: str, **fields: Any) -> dict[str, Any]:
        _, body = await self.call("POST", "/deployments", token, json=fields, expect=201)
        return dict(body)


# -- Keystone ------------------------------------------------------------------------------------------------


@dataclass
class Project:
    """A Keystone project with one user per role, and its Kubernetes namespace."""

    id: str
    name: str
    member: str
    reader: str
    observer: str
    unscoped: str
    member_user_id: str
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def ns(self) -> str:
        return self.id


class Keystone:
    """Just enough of the Keystone admin API to make projects, users, role assignments and tokens."""

    def __init__(self, url: str, password: str) -> None:
        self.url = url.rstrip("/")
        self.password = password
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self.admin_token = ""
        self.roles: dict[str, str] = {}
        self.shared: dict[str, tuple[str, str, str]] = {}
        self.unscoped = ""
        self.admin_project_id = ""

    async def setup(self) -> None:
        self.admin_token = await self.token("admin", self.password, project_name="admin")
        async with self.http.get(f"{self.url}/projects", params={"name": "admin"}, headers=self._h()) as r:
            self.admin_project_id = (await r.json())["projects"][0]["id"]
        async with self.http.get(f"{self.url}/roles", headers=self._h()) as r:
            self.roles = {x["name"]: x["id"] for x in (await r.json())["roles"]}
        if "observer" not in self.roles:
            self.roles["observer"] = (await self._post("/roles", {"role": {"name": "observer"}}))["role"]["id"]

    def _h(self) -> dict[str, str]:
        return {"X-Auth-Token": self.admin_token}

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(self.url + path, json=body, headers=self._h()) as r:
            assert r.status == 201, await r.text()
            return dict(await r.json())

    async def token(
        self, user: str, password: str, *, project_id: str | None = None, project_name: str | None = None,
        system: bool = False,
    ) -> str:
        auth: dict[str, Any] = {
            "identity": {
                "methods": ["password"],
                "password": {"user": {"name": user, "domain": {"id": "default"}, "password": password}},
            }
        }
        if system:
            auth["scope"] = {"system": {"all": True}}
        elif project_id:
            auth["scope"] = {"project": {"id": project_id}}
        elif project_name:
            auth["scope"] = {"project": {"name": project_name, "domain": {"id": "default"}}}
        for attempt in range(3):
            try:
                async with self.http.post(f"{self.url}/auth/tokens", json={"auth": auth}) as r:
                    if r.status == 201:
                        return r.headers["X-Subject-Token"]
                    if r.status < 500 or attempt == 2:
                        raise AssertionError(f"token: {r.status} {await r.text()}")
            except TimeoutError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def system_token(self) -> str:
        """A system-scoped token of the bootstrap admin (Keystone's platform administrator)."""
        return await self.token("admin", self.password, system=True)

    async def user_with_role(self, project_id: str, role: str) -> tuple[str, str, str]:
        """A new user holding ``role`` on ``project_id``: (user id, name, password)."""
        name, pw = f"cp-{uuid.uuid4().hex[:8]}-{role}", uuid.uuid4().hex
        body = {"user": {"name": name, "password": pw, "domain_id": "default"}}
        uid = (await self._request("POST", "/users", 201, body))["user"]["id"]
        await self._request("PUT", f"/projects/{project_id}/users/{uid}/roles/{self.roles[role]}", 204)
        return uid, name, pw

    async def short_lived_token(self, project: Project, lifetime_s: float) -> str:
        """A member token of ``project`` that Keystone expires after ``lifetime_s`` (an application credential
        with that expiry: Keystone caps its tokens' ``expires_at`` at the credential's)."""
        uid, uname, pw = self.shared["member"]
        user_token = await self.token(uname, pw, project_id=project.id)
        expires = (datetime.now(UTC) + timedelta(seconds=lifetime_s)).strftime("%Y-%m-%dT%H:%M:%S.%f")
        body = {"application_credential": {"name": f"short-{uuid.uuid4().hex[:8]}", "expires_at": expires}}
        async with self.http.post(f"{self.url}/users/{uid}/application_credentials", json=body,
                                  headers={"X-Auth-Token": user_token}) as r:
            assert r.status == 201, await r.text()
            cred = (await r.json())["application_credential"]
        auth = {"identity": {"methods": ["application_credential"],
                             "application_credential": {"id": cred["id"], "secret": cred["secret"]}}}
        async with self.http.post(f"{self.url}/auth/tokens", json={"auth": auth}) as r:
            assert r.status == 201, await r.text()
            return str(r.headers["X-Subject-Token"])

    async def revoke(self, token: str) -> None:
        async with self.http.delete(
            f"{self.url}/auth/tokens", headers={**self._h(), "X-Subject-Token": token}
        ) as r:
            assert r.status == 204

    async def _request(self, method: str, path: str, expect: int, body: Any = None) -> Any:
        """Admin call with a retry: one slow Keystone worker on a busy 2-core machine must not fail a test."""
        for attempt in range(3):
            try:
                async with self.http.request(method, self.url + path, json=body, headers=self._h()) as r:
                    if r.status == expect:
                        return await r.json() if r.status != 204 else None
                    if r.status < 500 or attempt == 2:
                        raise AssertionError(f"{method} {path}: {r.status} {await r.text()}")
            except TimeoutError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _users(self) -> dict[str, tuple[str, str]]:
        """One user per role, shared by every test project (creating users means bcrypt: keep it rare)."""
        if not self.shared:
            tag = uuid.uuid4().hex[:6]
            for role in ("member", "reader", "observer"):
                pw = uuid.uuid4().hex
                body = {"user": {"name": f"cp-{tag}-{role}", "password": pw, "domain_id": "default"}}
                uid = (await self._request("POST", "/users", 201, body))["user"]["id"]
                self.shared[role] = (uid, f"cp-{tag}-{role}", pw)
        return {k: (v[0], v[1]) for k, v in self.shared.items()}

    async def project(self) -> Project:
        name = f"cp-{uuid.uuid4().hex[:10]}"
        body = {"project": {"name": name, "domain_id": "default"}}
        pid = (await self._request("POST", "/projects", 201, body))["project"]["id"]
        await self._users()
        tokens = {}
        for role, (uid, uname, pw) in self.shared.items():
            await self._request("PUT", f"/projects/{pid}/users/{uid}/roles/{self.roles[role]}", 204)
            tokens[role] = await self.token(uname, pw, project_id=pid)
        if not self.unscoped:
            _, uname, pw = self.shared["member"]
            self.unscoped = await self.token(uname, pw)
        return Project(pid, name, tokens["member"], tokens["reader"], tokens["observer"], self.unscoped,
                       self.shared["member"][0])


# -- Kubernetes (the test plays cluster admin and the KServe controller) ------------------------------------


class Cluster:
    """Admin access to the real apiserver, plus what KServe and the platform would do.

    The control plane itself (the app under test) talks to this apiserver only as its ServiceAccount from k8s/
    (tools/testenv/controlplane_identity.py): a project namespace is usable by it once `provision` has bound it
    there with k8s/project's RoleBinding, as the platform does."""

    WORKLOADS_ROLE = "sr-controlplane-workloads"

    def __init__(self, kubeconfig: str, ctl: str, controlplane_namespace: str) -> None:
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.ctl = ctl.split()
        self.controlplane_namespace = controlplane_namespace
        self.user = f"system:serviceaccount:{controlplane_namespace}:sr-controlplane"
        self.provisioned: list[str] = []

    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def provision(self, ns: str) -> None:
        """What the platform does for a project: create its namespace and bind the control plane in it."""
        await self.run(self.core.create_namespace, {"metadata": {"name": ns}})
        docs = render("project", namespace=ns)
        bind_to(docs, self.controlplane_namespace)
        for doc in (d for d in docs if d["kind"] == "RoleBinding"):  # (k8s/project also fences it: NetworkPolicy,
            await self.run(self.rbac.create_namespaced_role_binding, ns, doc)  # quota; not this suite's subject)
        self.provisioned.append(ns)

    async def terminate_namespace(self, ns: str) -> None:
        """Delete a namespace; with no namespace controller running it stays Terminating for good."""
        await self.run(self.core.delete_namespace, ns)

    @asynccontextmanager
    async def rbac_revoked(self) -> AsyncIterator[None]:
        """Take the control plane's workload ClusterRole (k8s/base, bound per project namespace) away for the
        block: Kubernetes then refuses its writes, pods, logs and exec everywhere."""
        role = await self.run(self.rbac.read_cluster_role, self.WORKLOADS_ROLE)
        await self.run(self.rbac.delete_cluster_role, self.WORKLOADS_ROLE)
        await self._wait_access(allowed=False)
        try:
            yield
        finally:
            body = {"metadata": {"name": self.WORKLOADS_ROLE, "labels": role.metadata.labels},
                    "rules": [self.api.sanitize_for_serialization(r) for r in role.rules]}
            await self.run(self.rbac.create_cluster_role, body)
            await self._wait_access(allowed=True)

    async def _wait_access(self, *, allowed: bool) -> None:
        assert self.provisioned, "revoking access needs a provisioned project namespace to check it in"
        review = {"spec": {"user": self.user, "groups": ["system:serviceaccounts", "system:authenticated"],
                           "resourceAttributes": {"group": GROUP, "resource": "llminferenceservices",
                                                  "verb": "update", "namespace": self.provisioned[-1]}}}
        authz = client.AuthorizationV1Api(self.api)
        for _ in range(100):
            res = await self.run(authz.create_subject_access_review, review)
            if bool(res.status.allowed) == allowed:
                await asyncio.sleep(0.2)
                return
            await asyncio.sleep(0.1)
        raise AssertionError("RBAC change did not take effect")

    @asynccontextmanager
    async def llmisvc_requires_router(self) -> AsyncIterator[None]:
        """A KServe upgrade that makes ``spec.router`` required: objects stored before it no longer pass
        validation, so Kubernetes rejects their updates (422) until they are fixed."""
        ext = client.ApiextensionsV1Api(self.api)
        name = "llminferenceservices.serving.kserve.io"

        async def set_required(required: list[str] | None) -> None:
            crd = await self.run(ext.read_custom_resource_definition, name)
            crd.spec.versions[0].schema.open_apiv3_schema.properties["spec"].required = required
            await self.run(ext.replace_custom_resource_definition, name, crd)
            probe = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "LLMInferenceService",
                     "metadata": {"name": "probe"}, "spec": {}}
            for _ in range(100):
                try:
                    await self.run(self.custom.create_namespaced_custom_object, GROUP, "v1alpha1", "default",
                                   "llminferenceservices", probe, dry_run="All")
                    accepted = True
                except ApiException as exc:
                    assert exc.status == 422, exc
                    accepted = False
                if accepted == (required is None):
                    return
                await asyncio.sleep(0.1)
            raise AssertionError("CRD change did not take effect")

        await set_required(["router"])
        try:
            yield
        finally:
            await set_required(None)

    @staticmethod
    def version(kind: str) -> tuple[str, str]:
        return ("v1beta1", "inferenceservices") if kind == "InferenceService" else ("v1alpha1", "llminferenceservices")

    async def get(self, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        ver, plural = self.version(kind)
        try:
            return dict(await self.run(self.custom.get_namespaced_custom_object, GROUP, ver, ns, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, kind: str, ns: str) -> list[dict[str, Any]]:
        ver, plural = self.version(kind)
        out = await self.run(self.custom.list_namespaced_custom_object, GROUP, ver, ns, plural)
        return list(out["items"])

    async def create(
        self, kind: str, ns: str, name: str, spec: dict[str, Any] | None = None, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        ver, plural = self.version(kind)
        body = {"apiVersion": f"{GROUP}/{ver}", "kind": kind, "metadata": {"name": name, "labels": labels or {}},
                "spec": spec or {}}
        return dict(await self.run(self.custom.create_namespaced_custom_object, GROUP, ver, ns, plural, body))

    async def delete(self, kind: str, ns: str, name: str) -> None:
        ver, plural = self.version(kind)
        await self.run(self.custom.delete_namespaced_custom_object, GROUP, ver, ns, plural, name)

    async def set_status(self, kind: str, ns: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Play the KServe controller: write the status subresource. For an InferenceService it first resolves
        the runtime the object names, as KServe's predictor reconciler does; when that fails, the status written
        is KServe's failure (``modelStatus`` with the reason), never the one asked for. Returns what was written."""
        ver, plural = self.version(kind)
        if kind == "InferenceService":
            obj = await self.get(kind, ns, name)
            assert obj is not None, f"no InferenceService {ns}/{name}"
            failure = await self.runtime_failure(ns, obj)
            if failure is not None:
                status = {"modelStatus": {"transitionStatus": "InvalidSpec",
                                          "states": {"activeModelState": "", "targetModelState": "FailedToLoad"},
                                          "lastFailureInfo": failure}}
        await self.run(
            self.custom.patch_namespaced_custom_object_status, GROUP, ver, ns, plural, name, {"status": status}
        )
        return status

    async def serving_runtime(self, ns: str, name: str) -> dict[str, Any] | None:
        """KServe's lookup (isvcutils.GetServingRuntime): a ServingRuntime in the namespace, else the
        ClusterServingRuntime of that name, else none."""
        for fn, args in ((self.custom.get_namespaced_custom_object, (GROUP, "v1alpha1", ns, "servingruntimes", name)),
                         (self.custom.get_cluster_custom_object, (GROUP, "v1alpha1", "clusterservingruntimes", name))):
            try:
                return dict(await self.run(fn, *args))
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return None

    async def runtime_failure(self, ns: str, isvc: dict[str, Any]) -> dict[str, str] | None:
        """What KServe reports for the InferenceService's runtime (``lastFailureInfo``), ``None`` when it resolves:
        missing, disabled, or not supporting the model format or protocol."""
        model = ((isvc.get("spec") or {}).get("predictor") or {}).get("model") or {}
        name = model.get("runtime")
        assert name, "the control plane always names the runtime (an auto-selected one is not what it deploys)"
        runtime = await self.serving_runtime(ns, name)
        if runtime is None:
            return {"reason": "RuntimeNotRecognized", "message": "Waiting for runtime to become available"}
        spec = runtime.get("spec") or {}
        if spec.get("disabled"):
            return {"reason": "RuntimeDisabled", "message": "Specified runtime is disabled"}
        protocol = model.get("protocolVersion") or "v1"
        if protocol not in (spec.get("protocolVersions") or ["v1"]):
            return {"reason": "NoSupportingRuntime",
                    "message": "Specified runtime does not support specified protocol version"}
        fmt = model.get("modelFormat") or {}
        if not any(f.get("name") == fmt.get("name") and (not fmt.get("version") or f.get("version") == fmt["version"])
                   for f in spec.get("supportedModelFormats") or []):
            return {"reason": "NoSupportingRuntime",
                    "message": "Specified runtime does not support specified framework/version"}
        return None

    async def add_pod(
        self, kind: str, ns: str, workload: str, idx: int = 0, component: str = "workload"
    ) -> str:
        """Play KServe + scheduler: a workload pod, bound to a node, labelled the way KServe labels it (an
        LLMInferenceService also has ``component="router-scheduler"`` pods, named ``<workload>-<component>``)."""
        labels = (
            {"serving.kserve.io/inferenceservice": workload}
            if kind == "InferenceService"
            else {"app.kubernetes.io/name": workload, "app.kubernetes.io/part-of": "llminferenceservice",
                  "kserve.io/component": component}
        )
        name = f"{workload}-pod-{idx}" if component == "workload" else f"{workload}-{component}-{idx}"
        body = {
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "fake-node-1", "containers": [{"name": "main", "image": "example/main:1"}]},
        }
        await self.run(self.core.create_namespaced_pod, ns, body)
        return name

    async def set_pod_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        """Play the kubelet: report a pod's phase and container states."""
        await self.run(self.core.patch_namespaced_pod_status, name, ns, {"status": status})

    async def remove_pod(self, ns: str, name: str) -> None:
        await self.run(self.core.delete_namespaced_pod, name, ns, grace_period_seconds=0)

    @contextmanager
    def apiserver_down(self) -> Iterator[None]:
        """Stop the real kube-apiserver for the duration of the block, then start it again."""
        subprocess.run([*self.ctl, "stop"], check=True)
        try:
            yield
        finally:
            subprocess.run([*self.ctl, "start"], check=True)


class SwallowingProxy:
    """A TCP proxy in front of the real apiserver that can lose one answer: once armed, the next connection
    that sends more than ``threshold`` bytes (TLS handshake included; a request with a large body) still
    reaches the apiserver, but nothing comes back, so the client times out after the apiserver acted.
    Later connections pass through untouched."""

    def __init__(self, upstream_port: int, threshold: int = 3000) -> None:
        self.upstream_port = upstream_port
        self.threshold = threshold
        self.armed = False
        self.swallowed = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state = {"sent": 0, "swallow": False}
        watch = self.armed

        async def client_to_server() -> None:
            while data := await reader.read(65536):
                state["sent"] += len(data)
                if watch and self.armed and state["sent"] > self.threshold:
                    self.armed, state["swallow"] = False, True
                    self.swallowed += 1
                up_writer.write(data)
                await up_writer.drain()

        async def server_to_client() -> None:
            while data := await up_reader.read(65536):
                if not state["swallow"]:
                    writer.write(data)
                    await writer.drain()

        try:
            await asyncio.gather(client_to_server(), server_to_client())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)


def kubeconfig_via(path: str, port: int, out: Path) -> str:
    """A copy of a kubeconfig whose server is ``127.0.0.1:port`` (the apiserver certificate covers it)."""
    cfg = yaml.safe_load(Path(path).read_text())
    for c in cfg["clusters"]:
        server = c["cluster"]["server"]
        c["cluster"]["server"] = server.rsplit(":", 1)[0] + f":{port}"
    out.write_text(yaml.safe_dump(cfg))
    return str(out)


def apiserver_port(kubeconfig: str) -> int:
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    return int(cfg["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])


# -- fixtures -------------------------------------------------------------------------------------------------


def public_catalog() -> dict[str, Any]:
    """Public test catalog: engines of every kind the rules distinguish, and artifacts in every state."""
    return {
        "engines": [
            {"id": "t-vllm", "name": "vLLM", "runtime": "vllm", "backend": "LLMInferenceService",
             "configName": "vllm-config", "resources": {"gpu": "1"}},
            {"id": "t-vllm-cpu", "name": "vLLM CPU", "runtime": "vllm", "backend": "LLMInferenceService",
             "configName": "vllm-cpu-config"},
            {"id": "t-vllm-kvt", "name": "vLLM manual KV", "runtime": "vllm", "backend": "LLMInferenceService",
             "configName": "vllm-kvt", "resources": {"gpu": "1"},
             "yaml": "spec:\n  template:\n    containers:\n    - args: [--kv-transfer-config, '{}']\n"},
            {"id": "t-sglang", "name": "SGLang", "runtime": "sglang", "backend": "LLMInferenceService",
             "configName": "sglang-config", "resources": {"gpu": "1"}},
            {"id": "t-triton", "name": "Triton + sr-gateway", "runtime": "triton", "backend": "InferenceService",
             "configName": "sr-gateway-triton", "modelFormat": "onnx"},
            {"id": "t-bad-backend", "name": "Broken", "runtime": "vllm", "backend": "Deployment",
             "configName": "nothing"},
        ],
        "models": [{"id": "t-model-qwen", "name": "qwen"}],
        "artifacts": [
            {"id": "t-art-qwen", "name": "Qwen2.5-7B-Instruct", "modelId": "t-model-qwen",
             "uri": f"oci://registry.example.com/models/qwen@{DIGEST}"},
            {"id": "t-art-notready", "name": "not ready", "uri": "oci://registry.example.com/x:1", "ready": False},
            {"id": "t-lora-ok", "name": "lora ok", "lora": True,
             "uri": f"oci://registry.example.com/lora/a@{DIGEST}"},
            {"id": "t-lora-ok2", "name": "lora ok 2", "lora": True,
             "uri": f"oci://registry.example.com/lora/b@{DIGEST}"},
            {"id": "t-lora-notready", "name": "lora not ready", "lora": True, "ready": False,
             "uri": f"oci://registry.example.com/lora/c@{DIGEST}"},
            {"id": "t-lora-noflag", "name": "not lora", "uri": f"oci://registry.example.com/lora/d@{DIGEST}"},
            {"id": "t-lora-tag", "name": "lora by tag", "lora": True, "uri": "oci://registry.example.com/lora/e:v1"},
        ],
    }


@pytest.fixture(scope="session")
def env() -> dict[str, str]:
    return {k: os.environ[k] for k in REQUIRED_ENV}


@pytest_asyncio.fixture(scope="session")
async def db_url(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A fresh catalog database for this session, on the backend SR_CP_TEST_DB selects."""
    async for url in _fresh_db(env, tmp_path_factory, "main"):
        yield url


async def _fresh_db(env: dict[str, str], tmp: pytest.TempPathFactory, tag: str) -> AsyncIterator[str]:
    backend = os.environ.get("SR_CP_TEST_DB", "sqlite")
    if backend == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp.mktemp(tag) / 'catalog.db'}"
        return
    assert backend == "postgresql", backend
    name = f"cp_{tag}_{uuid.uuid4().hex[:8]}"
    admin = make_engine(env["SR_TEST_PG_DSN"]).execution_options(isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield env["SR_TEST_PG_DSN"].rsplit("/", 1)[0] + "/" + name
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    await admin.dispose()


@pytest_asyncio.fixture(scope="session")
async def catalog_db(db_url: str) -> str:
    engine = make_engine(db_url)
    await migrate(engine)
    await import_catalog(engine, public_catalog())
    await engine.dispose()
    return db_url


async def make_client(settings: Settings) -> TestClient[Any, Any]:
    tc: TestClient[Any, Any] = TestClient(TestServer(create_app(settings), host="127.0.0.1"))
    await tc.start_server()
    return tc


def settings_for(
    env: dict[str, str], db: str, *, kube: bool = True, ttl: float = TOKEN_TTL_S, admin_project: str | None = None
) -> Settings:
    return Settings(
        global_read_project_id=admin_project,
        database_url=db,
        keystone_url=env["SR_TEST_KEYSTONE_URL"],
        kubeconfig=env["SR_TEST_KUBE_CP_KUBECONFIG"] if kube else None,
        kube_timeout_s=5.0,
        probe_timeout_s=PROBE_TIMEOUT_S,
        token_cache_ttl_s=ttl,
        reconcile_interval_s=0.0,  # off: tests of the reconciler start their own
        reconcile_lease_namespace=env["SR_TEST_CP_NAMESPACE"],  # the ServiceAccount's Role allows Leases there only
    )


@pytest_asyncio.fixture(scope="session")
async def api(env: dict[str, str], catalog_db: str, keystone: Keystone) -> AsyncIterator[Api]:
    """The service as deployed: catalog + Kubernetes + Keystone; Keystone's bootstrap project "admin" is the
    platform's admin project (its admins have global read)."""
    tc = await make_client(settings_for(env, catalog_db, admin_project=keystone.admin_project_id))
    yield Api(tc)
    await tc.close()


@pytest_asyncio.fixture(scope="session")
async def api_short_ttl(env: dict[str, str], catalog_db: str) -> AsyncIterator[Api]:
    """The service with a one-second token cache, to watch a revocation take effect."""
    tc = await make_client(settings_for(env, catalog_db, ttl=SHORT_TOKEN_TTL_S))
    yield Api(tc)
    await tc.close()


@pytest_asyncio.fixture(scope="session")
async def api_nokube(env: dict[str, str], catalog_db: str) -> AsyncIterator[Api]:
    """The same catalog served by a platform where Kubernetes is not configured."""
    tc = await make_client(settings_for(env, catalog_db, kube=False))
    yield Api(tc)
    await tc.close()


@pytest_asyncio.fixture(scope="session")
async def api_broken(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Api]:
    """A service whose catalog lost its deployments table after startup: every catalog query fails."""
    async for url in _fresh_db(env, tmp_path_factory, "broken"):
        engine = make_engine(url)
        await migrate(engine)
        await import_catalog(engine, public_catalog())
        tc = await make_client(settings_for(env, url))
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP TABLE deployments"))
        await engine.dispose()
        yield Api(tc)
        await tc.close()


@pytest_asyncio.fixture(scope="session")
async def keystone(env: dict[str, str]) -> AsyncIterator[Keystone]:
    ks = Keystone(env["SR_TEST_KEYSTONE_URL"], env["SR_TEST_KEYSTONE_ADMIN_PASSWORD"])
    await ks.setup()
    yield ks
    await ks.http.close()


@pytest.fixture(scope="session")
def cluster(env: dict[str, str]) -> Cluster:
    return Cluster(env["SR_TEST_KUBE_ADMIN_KUBECONFIG"], env["SR_TEST_APISERVER_CTL"], env["SR_TEST_CP_NAMESPACE"])


@pytest_asyncio.fixture
async def project(keystone: Keystone, cluster: Cluster) -> Project:
    """A fresh project with its namespace provisioned and the control plane allowed in it."""
    p = await keystone.project()
    await cluster.provision(p.ns)
    return p


@pytest_asyncio.fixture(scope="session")
async def shared_project(keystone: Keystone, cluster: Cluster) -> Project:
    """One project for tests that only look at their own request (validation errors): creating a project
    per test is the slowest part of the suite."""
    p = await keystone.project()
    await cluster.provision(p.ns)
    return p


@pytest_asyncio.fixture
async def other_project(keystone: Keystone, cluster: Cluster) -> Project:
    p = await keystone.project()
    await cluster.provision(p.ns)
    return p


@pytest_asyncio.fixture(scope="session")
async def admin_token(keystone: Keystone) -> str:
    return keystone.admin_token


def vllm(name: str | None = None, **extra: Any) -> dict[str, Any]:
    """A valid create body for the public vLLM engine and artifact."""
    return {"name": name or f"llm-{uuid.uuid4().hex[:6]}", "engineId": "t-vllm", "artifactId": "t-art-qwen",
            "modelId": "t-model-qwen", **extra}


def triton(name: str | None = None, **extra: Any) -> dict[str, Any]:
    """A valid create body for the public Triton engine with a model URI."""
    return {"name": name or f"tri-{uuid.uuid4().hex[:6]}", "engineId": "t-triton",
            "modelUri": f"registry.example.com/models/minilm@{DIGEST}", **extra}
