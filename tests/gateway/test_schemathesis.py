"""The served OpenAPI document checked the way a stranger would, and held exactly as strict as the server:
schemathesis generates requests for every operation of the gateway (valid ones from the document, plus its
coverage phase's edge and negative values) and

- every response is documented: no 5xx, a documented status code, content type and headers, a body that validates
  against the response schema;
- a schema-valid request is never rejected with a 4xx (positive_data_acceptance), and a schema-invalid one is
  always rejected (negative_data_rejection).

The served document names the models of the process (`model` is an enum of the models serving the operation's
surface) and what their decision cards answer, so requests reach real validation and real models. The rules an
OpenAPI 3.0 document cannot state (cross-field and cross-item rules, object key rules, facts of one model's card,
image content) and the spec's in-place answers (bundle tasks, System One batch entries, decisions questions) are
listed, each with its reason, in tests/gateway/schemathesis_hooks.py; a failure is dropped only when the server's
answer shows it is one of them. Bounded examples and a fixed seed, so a failure reproduces (the command and the
seed are in the output)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SEED = 20261130
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance,positive_data_acceptance,negative_data_rejection")
HOOKS = Path(__file__).resolve().parent / "schemathesis_hooks.py"


def test_every_generated_request_gets_a_documented_response_and_the_document_is_as_strict_as_the_server(
        gateway_url: str) -> None:
    st = Path(sys.executable).parent / "st"
    command = [str(st), "run", f"{gateway_url}/openapi.yaml", "--checks", CHECKS, "--max-examples", "25",
               "--seed", str(SEED), "--workers", "2", "--no-color", "--output-sanitize", "false"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-8000:]}\n{done.stderr[-2000:]}"
