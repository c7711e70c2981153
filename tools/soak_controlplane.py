"""The control plane under a long, varied load (issue 23): is its memory flat?

    python -m tools.soak_controlplane --minutes 30 [--warmup-minutes 5] [--callers 8] [--token-cache-size 128]
                                      [--invalid-limit 5] [--malloc-arena-max N] [--tracemalloc]
                                      [--out .cache/soak-controlplane]

It starts its own test environment (tools/testenv/up.sh: etcd, kube-apiserver, the stand-in kubelet, Keystone,
PostgreSQL) on ports of its own (PORTS below, 2xxxx; `SR_TESTENV_*` set in the environment win: another env may
hold the defaults, and a second soak may run beside this one), makes Keystone projects and users, provisions
their namespaces as the platform does (k8s/project's RoleBinding), and starts
`sr-controlplane serve` on a free loopback port with a PostgreSQL catalog and the reconciler on, as the tests
connect it (its ServiceAccount's kubeconfig). Then `--callers` callers run a closed-loop mix until the time is up:

- creates (LLMInferenceService and InferenceService engines, varied names, replicas, env, args, labels,
  resources), lists, gets, updates, stops, starts, deletes, pods, api-schemas, metrics (503: no Prometheus);
  every created workload gets a pod on the stand-in kubelet's node, as KServe would make;
- container logs, and followed logs that stay open 0.5–4 s and are then dropped by the client;
- terminal sessions (exec through the apiserver to the stand-in kubelet: a shell that echoes, then exits or is
  dropped);
- bad bodies (400, 413) and a reader token's writes (403), and bursts of 1–8 invalid tokens from 160 loopback
  source addresses (401, then 429 past `--invalid-limit`, SR_CP_INVALID_TOKEN_LIMIT for the run);
- many distinct valid tokens: a pool minted at the start and one new token every `--mint-every-s` replacing a
  pool entry, with the token cache set to `--token-cache-size` (default 128, well under the pool) so it fills,
  evicts and re-validates throughout.

Meanwhile the reconciler passes every `--reconcile-s` (2 s, not the default 30: more passes in the time) and the
resident memory of the control-plane process (RSS and anonymous RSS) is sampled every `--sample-s` s, and for
context each environment process's (tree) RSS. It writes soak.json (samples, growth per minute after warm-up,
requests by kind, statuses, errors with examples, latency percentiles) and soak.png (the control plane only)
under `--out`. With `--tracemalloc` the control plane starts tracing when the load starts and dumps a snapshot
at the end of warm-up and 10 s before the end; the allocation sites that grew most between them go into soak.json
(`tracemalloc_diff`); RSS is then tracemalloc's too, so measure memory without it.
Teardown (control plane, then tools/testenv/down.sh) always runs, on an error or SIGINT/SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from tools.soak import ANON, anon_rss, growth, plot, sample_rows, stop_process

ROOT = Path(__file__).resolve().parents[1]
TESTENV = ROOT / "tools" / "testenv"
# Not the defaults (12379, 16443, ...): the controlplane suite's own env may be running beside this one. Below
# Linux's ephemeral range (32768-60999): a port in it can be taken by any outgoing connection between up.sh's
# check and the bind (45432 was, once: PostgreSQL could not start).
# An SR_TESTENV_* variable already set wins (two soaks side by side).
PORTS = {k: os.environ.get(k, v) for k, v in {
    "SR_TESTENV_ETCD_PORT": "22379", "SR_TESTENV_ETCD_PEER_PORT": "22380", "SR_TESTENV_KUBE_PORT": "26443",
    "SR_TESTENV_KEYSTONE_PORT": "25000", "SR_TESTENV_PG_PORT": "25432", "SR_TESTENV_KUBELET_PORT": "20250"}.items()}
CP = "controlplane"
CP_NAMESPACE = "sr-gateway"  # the control plane's own namespace in the test env (tools/testenv/up.sh)
DIGEST = "sha256:" + "ab" * 32
CATALOG = {
    "engines": [
        {"id": "s-vllm", "name": "vLLM", "runtime": "vllm", "backend": "LLMInferenceService",
         "configName": "vllm-config", "resources": {"gpu": "1"}},
        {"id": "s-vllm-cpu", "name": "vLLM CPU", "runtime": "vllm", "backend": "LLMInferenceService",
         "configName": "vllm-cpu-config"},
        {"id": "s-triton", "name": "Triton + sr-gateway", "runtime": "triton", "backend": "InferenceService",
         "configName": "sr-gateway-triton", "modelFormat": "onnx"},
    ],
    "models": [{"id": "s-model-qwen", "name": "qwen"}],
    "artifacts": [{"id": "s-art-qwen", "name": "Qwen2.5-7B-Instruct", "modelId": "s-model-qwen",
                   "uri": f"oci://registry.example.com/models/qwen@{DIGEST}"}],
}
INVALID_SOURCES = 160  # loopback addresses presenting invalid tokens: more than the limiter's cache holds at 128
# op -> (weight, statuses that are not an error)
OPS: dict[str, tuple[int, frozenset[int]]] = {
    "list": (10, frozenset({200})),
    "get": (10, frozenset({200})),
    "create": (6, frozenset({201})),
    "update": (5, frozenset({200, 409})),
    "stop": (3, frozenset({200, 409})),
    "start": (3, frozenset({200, 409})),
    "delete": (4, frozenset({204})),
    "pods": (6, frozenset({200})),
    "api_schemas": (2, frozenset({200})),
    "metrics": (2, frozenset({503})),
    "logs": (5, frozenset({200})),
    "logs_follow": (6, frozenset({200, 429})),
    "exec": (4, frozenset({200, 429})),
    "bad_body": (4, frozenset({400, 413})),
    "forbidden": (2, frozenset({403})),
    "invalid_token": (8, frozenset({401, 429})),
}
MAX_OWN = 6  # deployments one caller keeps at once: the cluster and catalog stay at a steady size


# -- the environment -----------------------------------------------------------------------------------------------
class Interrupted(Exception):
    """SIGTERM: unwind through every teardown, as SIGINT does."""


@contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGTERM raises (like SIGINT's KeyboardInterrupt), so every `finally` below runs and nothing is left."""
    def stop(*_: object) -> None:
        raise Interrupted("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def testenv(log: Path) -> Iterator[dict[str, str]]:
    """tools/testenv/up.sh on this tool's ports; yields what its env.sh exports; down.sh at the end, always (the
    environment's logs are copied next to `log` first).

    An interrupt while up.sh runs waits for it (it records every PID only as it goes) and then tears down."""
    proc = subprocess.Popen(["bash", str(TESTENV / "up.sh")], stdout=subprocess.PIPE, stderr=log.open("w"),
                            text=True, env={**os.environ, **PORTS}, start_new_session=True)
    interrupted: BaseException | None = None
    while True:
        try:
            out, _ = proc.communicate()
            break
        except (KeyboardInterrupt, Interrupted) as exc:
            interrupted = exc
    lines = out.strip().splitlines()
    run = lines[-1] if lines and lines[-1].startswith("/tmp/sr-cp-testenv.") else ""
    try:
        if interrupted is not None:
            raise interrupted
        if proc.returncode != 0 or not run:
            raise RuntimeError(f"tools/testenv/up.sh failed ({proc.returncode}); see {log}")
        env = {}
        for line in Path(run, "env.sh").read_text().splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export "):].partition("=")
                env[key] = value.strip('"')
        yield env
    finally:
        if run:
            for name in ("keystone/keystone.log", "kubelet.log", "apiserver.log", "etcd.log"):
                with suppress(OSError):
                    shutil.copyfile(Path(run, name), log.parent / f"env-{Path(name).name}")
            subprocess.run(["bash", str(TESTENV / "down.sh"), run], check=False, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)


def env_pids(run: str) -> dict[str, int]:
    """The environment's processes (each the root of its tree): etcd, the stand-in kubelet, Keystone, the
    apiserver and PostgreSQL's postmaster."""
    pids = {}
    for line in Path(run, "pids").read_text().splitlines():
        name, _, pid = line.partition(" ")
        pids[name] = int(pid)
    with suppress(OSError, ValueError):
        pids["kube-apiserver"] = int(Path(run, "apiserver.pid").read_text())
    with suppress(OSError, ValueError, IndexError):
        pgdir = Path(run, "pg.dir").read_text().strip()
        pids["postgres"] = int(Path(pgdir, "pg", "data", "postmaster.pid").read_text().split()[0])
    return pids


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def memory_row(cp_pid: int, env: dict[str, int]) -> dict[str, float]:
    """The control plane's RSS and anonymous RSS; each environment process tree's RSS ("env:<name>")."""
    from gateway.metrics import process_tree_memory

    row: dict[str, float] = {}
    if (rss := rss_mib(cp_pid)) is not None:
        row[CP] = rss
    if (anon := anon_rss(cp_pid)) is not None:
        row[ANON + CP] = round(anon / 2**20, 1)
    for name, pid in env.items():
        if Path(f"/proc/{pid}").exists():
            row[f"env:{name}"] = round(sum(p.rss_bytes for p in process_tree_memory(pid)) / 2**20, 1)
    return row


# -- Keystone and Kubernetes, as the platform -----------------------------------------------------------------------
class Keystone:
    """The admin API calls the soak needs: projects, users, role assignments, tokens."""

    def __init__(self, http: aiohttp.ClientSession, url: str, password: str) -> None:
        self.http, self.url, self.password = http, url.rstrip("/"), password
        self.admin = ""
        self.roles: dict[str, str] = {}

    async def setup(self) -> str:
        """The admin token and the role ids; returns the admin project's id (the platform's admin project)."""
        self.admin = await self.token("admin", self.password, project_name="admin")
        self.roles = {r["name"]: r["id"] for r in (await self.call("GET", "/roles", 200))["roles"]}
        return str((await self.call("GET", "/projects?name=admin", 200))["projects"][0]["id"])

    async def call(self, method: str, path: str, expect: int, body: Any = None) -> Any:
        """One admin call; a 5xx is tried twice more (Keystone's one SQLite worker answers 500 now and then on a
        busy host, as the controlplane suite's helper knows)."""
        for attempt in range(3):
            async with self.http.request(method, self.url + path, json=body,
                                         headers={"X-Auth-Token": self.admin}) as r:
                if r.status == expect:
                    return await r.json() if r.status != 204 else None
                if r.status < 500 or attempt == 2:
                    raise RuntimeError(f"Keystone {method} {path}: {r.status} {await r.text()}")
            await asyncio.sleep(1.0)
        raise AssertionError("unreachable")

    async def token(self, user: str, password: str, *, project_id: str | None = None,
                    project_name: str | None = None) -> str:
        scope = {"project": {"id": project_id}} if project_id else {
            "project": {"name": project_name, "domain": {"id": "default"}}}
        auth = {"identity": {"methods": ["password"], "password": {
            "user": {"name": user, "domain": {"id": "default"}, "password": password}}}, "scope": scope}
        for attempt in range(3):
            async with self.http.post(self.url + "/auth/tokens", json={"auth": auth}) as r:
                if r.status == 201:
                    return str(r.headers["X-Subject-Token"])
                if r.status < 500 or attempt == 2:
                    raise RuntimeError(f"Keystone token: {r.status} {await r.text()}")
            await asyncio.sleep(1.0)
        raise AssertionError("unreachable")

    async def project(self, name: str) -> str:
        body = {"project": {"name": name, "domain_id": "default"}}
        return str((await self.call("POST", "/projects", 201, body))["project"]["id"])

    async def user(self, name: str, password: str) -> str:
        body = {"user": {"name": name, "password": password, "domain_id": "default"}}
        return str((await self.call("POST", "/users", 201, body))["user"]["id"])

    async def grant(self, project_id: str, user_id: str, role: str) -> None:
        await self.call("PUT", f"/projects/{project_id}/users/{user_id}/roles/{self.roles[role]}", 204)


class Cluster:
    """The apiserver as its admin: namespaces bound to the control plane, and the pods KServe would make."""

    def __init__(self, kubeconfig: str) -> None:
        import ssl

        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self.server = cluster["server"]
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx),
                                          headers={"Authorization": f"Bearer {user['token']}"},
                                          timeout=aiohttp.ClientTimeout(total=30))

    async def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> None:
        async with self.http.request(method, self.server + path, json=body) as r:
            if r.status not in ok:
                raise RuntimeError(f"apiserver {method} {path}: {r.status} {await r.text()}")

    async def provision(self, ns: str) -> None:
        """What the platform does for a project: its namespace, and k8s/project's RoleBinding for the control plane."""
        from k8s.render import bind_to, render

        await self.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        docs = render("project", namespace=ns)
        bind_to(docs, CP_NAMESPACE)
        for doc in (d for d in docs if d["kind"] == "RoleBinding"):
            await self.call("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", doc)

    async def add_pod(self, kind: str, ns: str, workload: str) -> None:
        """A workload pod bound to the stand-in kubelet's node, labelled as KServe labels it."""
        labels = ({"serving.kserve.io/inferenceservice": workload} if kind == "InferenceService" else
                  {"app.kubernetes.io/name": workload, "app.kubernetes.io/part-of": "llminferenceservice",
                   "kserve.io/component": "workload"})
        body = {"metadata": {"name": f"{workload}-pod-0", "labels": labels},
                "spec": {"nodeName": "fake-node-1", "containers": [{"name": "main", "image": "example/main:1"}]}}
        await self.call("POST", f"/api/v1/namespaces/{ns}/pods", body)

    async def remove_pod(self, ns: str, workload: str) -> None:
        await self.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{workload}-pod-0?gracePeriodSeconds=0",
                        ok=(200, 202, 404))


@dataclass
class Tenants:
    """Projects, and a pool of distinct valid tokens per project and role (refilled while the soak runs)."""

    projects: list[str]
    users: dict[str, list[tuple[str, str]]]  # role -> [(name, password)], each holding that role on every project
    pool: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (project, role) -> tokens
    minted: int = 0

    def token(self, rng: random.Random, project: str, role: str) -> str:
        return rng.choice(self.pool[(project, role)])

    async def mint(self, ks: Keystone, rng: random.Random, project: str, role: str) -> str:
        name, password = rng.choice(self.users[role])
        self.minted += 1
        return await ks.token(name, password, project_id=project)


async def tenants(ks: Keystone, cluster: Cluster, n_projects: int, per_pair: int) -> Tenants:
    """`n_projects` provisioned projects, 3 members and 2 readers on each, `per_pair` tokens per user and project."""
    tag = uuid.uuid4().hex[:6]
    users: dict[str, list[tuple[str, str]]] = {"member": [], "reader": []}
    ids: dict[str, list[str]] = {"member": [], "reader": []}
    for role, count in (("member", 3), ("reader", 2)):
        for i in range(count):
            name, password = f"soak-{tag}-{role}-{i}", uuid.uuid4().hex
            ids[role].append(await ks.user(name, password))
            users[role].append((name, password))
    out = Tenants([], users)
    for p in range(n_projects):
        project = await ks.project(f"soak-{tag}-{p}")
        await cluster.provision(project)
        for role in ids:
            for uid in ids[role]:
                await ks.grant(project, uid, role)
        out.projects.append(project)
        for role, members in users.items():
            out.pool[(project, role)] = [await ks.token(name, pw, project_id=project)
                                         for name, pw in members for _ in range(per_pair)]
    return out


async def catalog_database(pg_dsn: str) -> str:
    """A fresh PostgreSQL database holding the schema and this soak's catalog; returns its URL."""
    import sqlalchemy as sa

    from controlplane.catalog import import_catalog
    from controlplane.db import make_engine, migrate

    name = f"soak_{uuid.uuid4().hex[:8]}"
    admin = make_engine(pg_dsn).execution_options(isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    await admin.dispose()
    url = pg_dsn.rsplit("/", 1)[0] + "/" + name
    engine = make_engine(url)
    await migrate(engine)
    await import_catalog(engine, CATALOG)
    await engine.dispose()
    return url


# -- the control plane ------------------------------------------------------------------------------------------------
class ControlPlane:
    """`sr-controlplane serve` on a free loopback port (under tracemalloc with `snapshots`), until stopped."""

    def __init__(self, env: dict[str, str], log: Path, snapshots: Path | None) -> None:
        from tools.benchlib import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("w")
        self.snapshots = snapshots
        serve = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        args = ([sys.executable, "-m", "tools.soak_controlplane", "traced", str(snapshots), *serve] if snapshots
                else [str(Path(sys.executable).parent / "sr-controlplane"), *serve])
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **env})

    async def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sr-controlplane exited with {self.proc.returncode}; see {self.log.name}")
                with suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.url + "/readyz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.5)
        raise TimeoutError(f"sr-controlplane not ready after {timeout} s; see {self.log.name}")

    async def snapshot(self, n: int) -> Path | None:
        """Ask the traced control plane for tracemalloc snapshot `n` (SIGUSR1; n = 0 starts tracing) and wait
        until it is written."""
        if self.snapshots is None:
            return None
        path = self.snapshots / (f"snapshot-{n}.pickle" if n else "tracing")
        self.proc.send_signal(signal.SIGUSR1)
        for _ in range(240):
            if path.exists():
                return path
            await asyncio.sleep(0.5)
        return None

    def stop(self) -> int:
        code = stop_process(self.proc, 30)
        self.log.close()
        return code


def traced(snapshots: str, argv: list[str]) -> int:
    """The control plane with tracemalloc (25 frames) on call: the first SIGUSR1 starts tracing (not at start:
    traced from the first import, the start took minutes on the loaded host), each later one writes the next
    snapshot to `snapshots`. Growth between two snapshots is all allocated after the start, so nothing is missed."""
    import tracemalloc

    from controlplane.cli import main

    taken = [0]

    def dump(*_: object) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(25)
            Path(snapshots, "tracing").touch()
            return
        taken[0] += 1
        tmp = Path(snapshots, f".snapshot-{taken[0]}.tmp")
        tracemalloc.take_snapshot().dump(str(tmp))
        tmp.rename(Path(snapshots, f"snapshot-{taken[0]}.pickle"))

    signal.signal(signal.SIGUSR1, dump)
    return main(argv)


def snapshot_diff(first: Path, second: Path, top: int = 25) -> list[dict[str, Any]]:
    """The allocation sites (by traceback, innermost frames last) that grew most between two snapshots."""
    import tracemalloc

    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    old = tracemalloc.Snapshot.load(str(first)).filter_traces(ignore)
    new = tracemalloc.Snapshot.load(str(second)).filter_traces(ignore)
    out = []
    for stat in new.compare_to(old, "traceback")[:top]:
        frames = [f"{f.filename.replace(str(ROOT) + '/', '')}:{f.lineno}" for f in stat.traceback]
        out.append({"size_diff_kib": round(stat.size_diff / 1024, 1), "size_kib": round(stat.size / 1024, 1),
                    "count_diff": stat.count_diff, "traceback": frames[-8:]})
    return out


# -- the load ---------------------------------------------------------------------------------------------------------
@dataclass
class Stats:
    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    statuses: dict[str, dict[str, int]] = field(default_factory=lambda: {op: {} for op in OPS})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    examples: list[str] = field(default_factory=list)
    setup_errors: int = 0

    def record(self, op: str, status: int, started: float, detail: str = "") -> None:
        self.latencies_ms[op].append((time.perf_counter() - started) * 1000)
        self.statuses[op][str(status)] = self.statuses[op].get(str(status), 0) + 1
        if status not in OPS[op][1]:
            self.errors[op] += 1
            if len(self.examples) < 40:
                self.examples.append(f"{op} {status} {detail[:300]}")

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for op in OPS:
            lat = np.array(self.latencies_ms[op] or [0.0])
            out[op] = {"requests": len(self.latencies_ms[op]), "errors": self.errors[op],
                       "statuses": self.statuses[op],
                       **{f"p{q}_ms": round(float(np.percentile(lat, q)), 1) for q in (50, 90, 99)}}
        return out


def words(rng: random.Random, low: int, high: int) -> str:
    pool = ["alpha", "beta", "gamma", "delta", "serving", "router", "model", "tenant", "stream", "cache", "token",
            "watch", "lease", "pod", "log"]
    return " ".join(rng.choice(pool) for _ in range(rng.randint(low, high)))


def create_body(rng: random.Random, name: str) -> dict[str, Any]:
    """A valid create body of one of the catalog's engines, with varied optional fields."""
    engine = rng.choice(["s-vllm", "s-vllm-cpu", "s-triton"])
    body: dict[str, Any] = {"name": name, "engineId": engine, "description": words(rng, 0, 40)}
    if engine == "s-triton":
        body["modelUri"] = f"registry.example.com/models/m{rng.randint(0, 99)}@{DIGEST}"
    else:
        body |= {"artifactId": "s-art-qwen", "modelId": "s-model-qwen"}
    if rng.random() < 0.5:
        body["replicas"] = rng.randint(1, 4)
    if rng.random() < 0.5:
        body["env"] = [{"name": f"VAR_{i}", "value": words(rng, 1, 6)} for i in range(rng.randint(0, 8))]
    if rng.random() < 0.4:
        body["args"] = [f"--opt-{i}={rng.randint(0, 999)}" for i in range(rng.randint(0, 6))]
    if rng.random() < 0.4:
        body["labels"] = {f"team{i}": f"v{rng.randint(0, 99)}" for i in range(rng.randint(0, 5))}
    if rng.random() < 0.5:
        body["resources"] = {"cpu": f"{rng.randint(1, 16)}", "memory": f"{rng.randint(1, 64)}Gi"}
        if engine == "s-vllm":
            body["resources"]["gpu"] = str(rng.randint(1, 2))
    return body


def bad_body(rng: random.Random) -> str:
    """A create body the spec rejects with 400 (or 413): every kind of bad input the callers vary between."""
    choices: list[Callable[[], Any]] = [
        lambda: {"name": ""},
        lambda: {"name": "x", "engineId": "s-vllm-cpu", "replicas": "two"},
        lambda: {"name": "x" * 300, "engineId": "s-vllm-cpu"},
        lambda: {"name": "x", "engineId": "s-vllm-cpu", "labels": {"kubernetes.io/x": "y"}},
        lambda: {"name": "x", "engineId": "s-vllm-cpu", "env": [{"name": 3}]},
        lambda: {"name": "x", "engineId": "s-vllm-cpu", "resources": {"cpu": "lots"}},
        lambda: {"name": "x", "nested": json.loads("[" * 40 + "]" * 40)},
        lambda: "not json {",
        lambda: {"name": "x", "engineId": "s-vllm-cpu", "description": "y" * rng.randint(1_100_000, 1_200_000)},
    ]
    value = rng.choice(choices)()
    return value if isinstance(value, str) else json.dumps(value)


@dataclass
class Own:
    """A deployment a caller created: its id, project, workload kind and name."""

    id: str
    project: str
    kind: str
    workload: str


class Caller:
    """One closed-loop caller: its own deployments in one project, tokens from that project's pools."""

    def __init__(self, k: int, url: str, http: aiohttp.ClientSession, cluster: Cluster, people: Tenants,
                 stats: Stats, invalid: dict[int, aiohttp.ClientSession], seed: int) -> None:
        self.k, self.url, self.http, self.cluster, self.people = k, url + "/api/v1", http, cluster, people
        self.stats, self.invalid = stats, invalid
        self.rng = random.Random(seed * 1000 + k)
        self.project = people.projects[k % len(people.projects)]
        self.own: list[Own] = []
        self.made = 0

    def headers(self, role: str, project: str | None = None) -> dict[str, str]:
        return {"x-keystone-token": self.people.token(self.rng, project or self.project, role)}

    async def request(self, op: str, method: str, path: str, role: str = "member", **kw: Any) -> tuple[int, Any]:
        started = time.perf_counter()
        status, body = 0, None
        try:
            async with self.http.request(method, self.url + path, headers=self.headers(role), **kw) as r:
                status = r.status
                raw = await r.read()
                body = json.loads(raw) if raw and r.content_type == "application/json" else raw
        except (aiohttp.ClientError, TimeoutError) as exc:
            body = type(exc).__name__
        self.stats.record(op, status, started, f"{method} {path} {body!r}")
        return status, body

    async def run(self, deadline: float) -> None:
        ops = list(OPS)
        weights = [OPS[op][0] for op in ops]
        while time.monotonic() < deadline:
            op = self.rng.choices(ops, weights)[0]
            if op in ("get", "update", "stop", "start", "delete", "pods", "logs", "logs_follow", "exec", "metrics",
                      "forbidden") and not self.own:
                op = "create"
            if op == "create" and len(self.own) >= MAX_OWN:
                op = "delete"
            await getattr(self, op)()

    def pick(self) -> Own:
        return self.rng.choice(self.own)

    async def list(self) -> None:
        page, size = self.rng.choice([(1, 0), (1, 5), (2, 5), (1, 200), (3, 2)])
        await self.request("list", "GET", f"/deployments?page={page}&page_size={size}",
                           self.rng.choice(["member", "reader"]))

    async def get(self) -> None:
        await self.request("get", "GET", f"/deployments/{self.pick().id}", self.rng.choice(["member", "reader"]))

    async def create(self) -> None:
        self.made += 1
        name = f"soak {self.k}-{self.made} {words(self.rng, 0, 2)}".strip()
        status, body = await self.request("create", "POST", "/deployments", json=create_body(self.rng, name))
        if status != 201 or not isinstance(body, dict):
            return
        own = Own(body["id"], self.project, body["backend"]["type"], body["backend"]["id"].split("/", 1)[1])
        self.own.append(own)
        try:
            await self.cluster.add_pod(own.kind, own.project, own.workload)
        except (RuntimeError, aiohttp.ClientError, TimeoutError):
            self.stats.setup_errors += 1

    async def update(self) -> None:
        patch: dict[str, Any] = self.rng.choice([
            {"description": words(self.rng, 0, 30)}, {"replicas": self.rng.randint(1, 4)},
            {"env": [{"name": "UPDATED", "value": words(self.rng, 1, 3)}]},
            {"description": "", "replicas": self.rng.randint(1, 4)},
        ])
        await self.request("update", "PATCH", f"/deployments/{self.pick().id}", json=patch)

    async def stop(self) -> None:
        await self.request("stop", "POST", f"/deployments/{self.pick().id}/stop")

    async def start(self) -> None:
        await self.request("start", "POST", f"/deployments/{self.pick().id}/start")

    async def delete(self) -> None:
        own = self.own.pop(self.rng.randrange(len(self.own)))
        await self.request("delete", "DELETE", f"/deployments/{own.id}")
        try:
            await self.cluster.remove_pod(own.project, own.workload)
        except (RuntimeError, aiohttp.ClientError, TimeoutError):
            self.stats.setup_errors += 1

    async def pods(self) -> None:
        await self.request("pods", "GET", f"/deployments/{self.pick().id}/pods", "reader")

    async def api_schemas(self) -> None:
        await self.request("api_schemas", "GET", "/deployments/api-schemas", "reader")

    async def metrics(self) -> None:
        await self.request("metrics", "GET", f"/deployments/{self.pick().id}/metrics?range=5m", "reader")

    async def logs(self) -> None:
        tail = self.rng.choice(["", "&tailLines=3", "&tailLines=500"])
        await self.request("logs", "GET", f"/deployments/{self.pick().id}/logs?container=main{tail}", "reader")

    async def logs_follow(self) -> None:
        """A followed log read for 0.5–4 s, then dropped by the client (the way a closed browser tab ends it)."""
        started, status, detail = time.perf_counter(), 0, ""
        path = f"/deployments/{self.pick().id}/logs?follow=true&container=main"
        try:
            r = await self.http.get(self.url + path, headers=self.headers("reader"))
            status = r.status
            try:
                if status == 200:
                    until = time.monotonic() + self.rng.uniform(0.5, 4.0)
                    while time.monotonic() < until:
                        with suppress(TimeoutError):
                            if not await asyncio.wait_for(r.content.readany(), until - time.monotonic()):
                                break
                else:
                    detail = (await r.read()).decode(errors="replace")
            finally:
                r.close()
        except (aiohttp.ClientError, TimeoutError) as exc:
            detail = type(exc).__name__
        self.stats.record("logs_follow", status, started, detail)

    async def exec(self) -> None:
        """A terminal: resize, a command and its echo, then `exit` or the client hanging up."""
        started, status, detail = time.perf_counter(), 0, ""
        path = f"/deployments/{self.pick().id}/exec?container=main"
        marker = f"soak-{self.k}-{self.rng.randint(0, 10**6)}"
        try:
            async with self.http.ws_connect(self.url + path, headers=self.headers("member")) as ws:
                status = 200
                await ws.send_json({"type": "resize", "cols": self.rng.randint(40, 200), "rows": 30})
                await ws.send_json({"type": "input", "data": f"echo {marker}\n"})
                seen = ""
                while marker not in seen.replace(f"echo {marker}", ""):
                    msg = await asyncio.wait_for(ws.receive(), 15)
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        raise RuntimeError(f"terminal closed before the echo: {msg.type}")
                    seen += msg.data
                if self.rng.random() < 0.5:
                    await ws.send_json({"type": "input", "data": "exit\n"})
                    while "session ended" not in seen:
                        msg = await asyncio.wait_for(ws.receive(), 15)
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        seen += msg.data
        except aiohttp.WSServerHandshakeError as exc:
            status, detail = exc.status, exc.message
        except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
            status, detail = 0, f"{type(exc).__name__}: {exc}"
        self.stats.record("exec", status, started, detail)

    async def bad_body(self) -> None:
        await self.request("bad_body", "POST", "/deployments", data=bad_body(self.rng))

    async def forbidden(self) -> None:
        """A reader's write: 403."""
        own = self.pick()
        method, path = self.rng.choice([("DELETE", f"/deployments/{own.id}"), ("POST", f"/deployments/{own.id}/stop"),
                                        ("POST", "/deployments")])
        await self.request("forbidden", method, path, "reader", json=create_body(self.rng, "nope"))

    async def invalid_token(self) -> None:
        """1–8 made-up tokens in a row from one of many loopback addresses (each its own entry in the limiter;
        a burst past the limit gets 429)."""
        source = self.rng.randrange(INVALID_SOURCES)
        session = self.invalid.get(source)
        if session is None:
            connector = aiohttp.TCPConnector(local_addr=(f"127.0.1.{source + 1}", 0), force_close=True)
            session = self.invalid[source] = aiohttp.ClientSession(connector=connector, timeout=self.http.timeout)
        for _ in range(self.rng.randint(1, 8)):
            started, status, detail = time.perf_counter(), 0, ""
            try:
                async with session.get(self.url + "/deployments",
                                       headers={"x-keystone-token": uuid.uuid4().hex + uuid.uuid4().hex}) as r:
                    status = r.status
                    await r.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                detail = type(exc).__name__
            self.stats.record("invalid_token", status, started, detail)


async def mint_tokens(ks: Keystone, people: Tenants, every_s: float, deadline: float, seed: int,
                      stats: Stats) -> None:
    """A new valid token every `every_s`, replacing a random one in its pool: the distinct tokens keep coming."""
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        project, role = rng.choice(people.projects), rng.choice(["member", "reader"])
        try:
            token = await people.mint(ks, rng, project, role)
            pool = people.pool[(project, role)]
            pool[rng.randrange(len(pool))] = token
        except (RuntimeError, aiohttp.ClientError, TimeoutError):
            stats.setup_errors += 1
        await asyncio.sleep(every_s)


# -- the run ----------------------------------------------------------------------------------------------------------
@asynccontextmanager
async def sessions(callers: int) -> AsyncIterator[tuple[aiohttp.ClientSession, dict[int, aiohttp.ClientSession]]]:
    invalid: dict[int, aiohttp.ClientSession] = {}
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers * 2),
                                 timeout=aiohttp.ClientTimeout(total=60))
    try:
        yield http, invalid
    finally:
        await http.close()
        for s in invalid.values():
            await s.close()


async def soak(args: argparse.Namespace, env: dict[str, str], out: Path) -> dict[str, Any]:
    from tools.benchlib import machine

    run_dir = env["SR_TESTENV_DIR"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as ks_http:
        ks = Keystone(ks_http, env["SR_TEST_KEYSTONE_URL"], env["SR_TEST_KEYSTONE_ADMIN_PASSWORD"])
        admin_project = await ks.setup()
        cluster = Cluster(env["SR_TEST_KUBE_ADMIN_KUBECONFIG"])
        try:
            print(f"making {args.projects} projects and their tokens", flush=True)
            people = await tenants(ks, cluster, args.projects, args.tokens_per_pair)
            db = await catalog_database(env["SR_TEST_PG_DSN"])
            snapshots = out / "tracemalloc" if args.tracemalloc else None
            if snapshots is not None:
                snapshots.mkdir(parents=True, exist_ok=True)
                for old in [*snapshots.glob("snapshot-*.pickle"), *snapshots.glob("tracing")]:
                    old.unlink()
            cp_env = {
                "SR_CP_DATABASE_URL": db, "SR_CP_KEYSTONE_URL": env["SR_TEST_KEYSTONE_URL"],
                "SR_CP_KUBECONFIG": env["SR_TEST_KUBE_CP_KUBECONFIG"], "SR_CP_GLOBAL_READ_PROJECT_ID": admin_project,
                "SR_CP_RECONCILE_INTERVAL_S": str(args.reconcile_s), "SR_CP_RECONCILE_LEASE_NAMESPACE": CP_NAMESPACE,
                "SR_CP_TOKEN_CACHE_SIZE": str(args.token_cache_size), "SR_CP_SHUTDOWN_TIMEOUT_S": "5",
                "SR_CP_ORPHAN_GRACE_S": "60", "SR_CP_INVALID_TOKEN_LIMIT": str(args.invalid_limit),
                **({"MALLOC_ARENA_MAX": str(args.malloc_arena_max)} if args.malloc_arena_max else {}),
                **dict(item.split("=", 1) for item in args.cp_env),
            }
            cp = ControlPlane(cp_env, out / "controlplane.log", snapshots)
            try:
                await cp.wait_ready()
                await cp.snapshot(0)
                print(f"control plane ready on {cp.url} (pid {cp.proc.pid}); {args.minutes:g} min of load",
                      flush=True)
                env_procs = env_pids(run_dir)
                stats, samples = Stats(), list[dict[str, Any]]()
                seconds, warmup = args.minutes * 60, args.warmup_minutes * 60
                started_wall, start = time.time(), time.monotonic()
                deadline = start + seconds
                sampler = asyncio.create_task(sample_rows(lambda: memory_row(cp.proc.pid, env_procs),
                                                          args.sample_s, deadline, samples))
                snaps: list[Path | None] = []

                async def snapshots_at() -> None:
                    await asyncio.sleep(warmup)
                    snaps.append(await cp.snapshot(1))
                    await asyncio.sleep(max(0.0, deadline - 10 - time.monotonic()))
                    snaps.append(await cp.snapshot(2))

                snapper = asyncio.create_task(snapshots_at()) if snapshots is not None else None
                async with sessions(args.callers) as (http, invalid):
                    minter = asyncio.create_task(mint_tokens(ks, people, args.mint_every_s, deadline, args.seed, stats))
                    callers = [Caller(k, cp.url, http, cluster, people, stats, invalid, args.seed)
                               for k in range(args.callers)]
                    await asyncio.gather(*(c.run(deadline) for c in callers))
                    await minter
                await sampler
                if snapper is not None:
                    await snapper
                rc = cp.stop()
            finally:
                cp.stop()
        finally:
            await cluster.http.close()
    summary = stats.summary()
    requests = sum(s["requests"] for s in summary.values())
    first, last = [*snaps, None, None][:2]
    diff = snapshot_diff(first, last) if first is not None and last is not None else None
    report = {
        "machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started_wall)),
        "minutes": args.minutes, "warmup_minutes": args.warmup_minutes, "callers": args.callers,
        "projects": args.projects, "token_cache_size": args.token_cache_size, "reconcile_s": args.reconcile_s,
        "invalid_limit": args.invalid_limit, "malloc_arena_max": args.malloc_arena_max, "cp_env": args.cp_env,
        "tracemalloc": args.tracemalloc, "ports": PORTS, "controlplane_exit": rc,
        "tokens_minted": people.minted + sum(len(v) for v in people.pool.values()),
        "requests": requests, "errors": sum(s["errors"] for s in summary.values()),
        "setup_errors": stats.setup_errors, "error_examples": stats.examples,
        "throughput_rps": round(requests / seconds, 1), "ops": summary,
        "growth": growth(samples, warmup), "samples": samples, "tracemalloc_diff": diff,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    cp_only = [{k: v for k, v in row.items() if k in ("t", CP, ANON + CP)} for row in samples]
    plot(cp_only, warmup, out / "soak.png",
         f"sr-controlplane RSS under a {args.minutes:g}-minute mixed load, {args.callers} callers")
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["traced"]:  # the control plane's own process, under tracemalloc
        return traced(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--warmup-minutes", type=float, default=5.0)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--projects", type=int, default=8)
    parser.add_argument("--tokens-per-pair", type=int, default=4, help="tokens minted per user and project")
    parser.add_argument("--token-cache-size", type=int, default=128, help="SR_CP_TOKEN_CACHE_SIZE for the run")
    parser.add_argument("--invalid-limit", type=int, default=5, help="SR_CP_INVALID_TOKEN_LIMIT for the run")
    parser.add_argument("--mint-every-s", type=float, default=2.0)
    parser.add_argument("--reconcile-s", type=float, default=2.0, help="SR_CP_RECONCILE_INTERVAL_S for the run")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--malloc-arena-max", type=int, default=0,
                        help="MALLOC_ARENA_MAX for the control plane (0: glibc's default, 8 per core)")
    parser.add_argument("--cp-env", action="append", default=[], metavar="KEY=VALUE",
                        help="one more environment variable for the control plane (e.g. GLIBC_TUNABLES=...)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="run the control plane under tracemalloc; diff snapshots at warm-up and end")
    parser.add_argument("--out", default=str(ROOT / ".cache" / "soak-controlplane"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with signals_unwind(), testenv(out / "testenv.log") as env:
        report = asyncio.run(soak(args, env, out))
    print(json.dumps({k: v for k, v in report.items() if k not in ("samples",)}, indent=1))
    print(f"wrote {out / 'soak.json'} and soak.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
