"""Schemathesis against the control plane's own OpenAPI document (served at /openapi.yaml), with a real
Keystone token, on the real catalog/apiserver/Keystone: no 5xx, and every response conforms (status code
declared, content type, body schema).

Why a separate process: schemathesis calls synchronously (requests), so the service runs as
``sr-controlplane serve`` beside the test, configured through its env twins like a deployment."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.controlplane.conftest import Project, vllm

EXAMPLES = int(os.environ.get("SR_CP_SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(env: dict[str, str], catalog_db: str, tmp_path: Path) -> Iterator[str]:
    """``sr-controlplane serve`` on 127.0.0.1, on the session's catalog; its base URL."""
    port = _free_port()
    proc_env = {**os.environ, "SR_CP_DATABASE_URL": catalog_db, "SR_CP_KEYSTONE_URL": env["SR_TEST_KEYSTONE_URL"],
                "SR_CP_KUBECONFIG": env["SR_TEST_KUBE_CP_KUBECONFIG"], "SR_CP_RECONCILE_INTERVAL_S": "0",
                "SR_CP_PROBE_TIMEOUT_S": "1", "SR_CP_KUBE_TIMEOUT_S": "5"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--port", str(port)],
                            env=proc_env, stdout=log, stderr=subprocess.STDOUT)
    if run_dir := os.environ.get("SR_TESTENV_DIR"):  # tools/testenv/down.sh stops it even if pytest dies
        with open(Path(run_dir) / "pids", "a") as pids:
            pids.write(f"controlplane {proc.pid}\n")
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _fuzz(base: str, token: str) -> list[str]:
    """Every operation, ``EXAMPLES`` generated requests each; returns the failures found."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.yaml")
    failures: list[str] = []
    http = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            case.call_and_validate(base_url=f"{base}/api/v1", session=http, checks=CHECKS,
                                   headers={"x-keystone-token": token}, timeout=30)

        try:
            run()
        except Exception as exc:  # collect every operation's failure, report them together
            failures.append(f"{operation.label}: {exc}"[:2000])
    return failures


@pytest.mark.asyncio
async def test_generated_requests_to_every_operation_get_no_5xx_and_conforming_responses(
    served: str, project: Project
) -> None:
    # Something real to find: one deployment in the token's project (ids are generated, so most calls 404).
    await asyncio.to_thread(requests.post, f"{served}/api/v1/deployments", json=vllm("fuzzed"),
                            headers={"x-keystone-token": project.member}, timeout=30)
    failures = await asyncio.to_thread(_fuzz, served, project.member)
    assert not failures, "\n\n".join(failures)
