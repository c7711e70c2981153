"""The served OpenAPI document checked the way a stranger would: schemathesis generates requests for every
operation of the gateway (valid ones from the document, plus its coverage phase's edge and negative values) and
every response must be documented — no 5xx, a documented status code, content type and headers, a body that
validates against the response schema. Bounded examples and a fixed seed, so a failure reproduces (the command
and the seed are in the output).

Not yet asserted: that the document is exactly as strict as the server (schemathesis' positive_data_acceptance and
negative_data_rejection checks); see docs/design.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SEED = 20261130
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance")


def test_every_generated_request_gets_a_documented_response(gateway_url: str) -> None:
    st = Path(sys.executable).parent / "st"
    command = [str(st), "run", f"{gateway_url}/openapi.yaml", "--checks", CHECKS, "--max-examples", "25",
               "--seed", str(SEED), "--workers", "2", "--no-color"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-8000:]}\n{done.stderr[-2000:]}"
