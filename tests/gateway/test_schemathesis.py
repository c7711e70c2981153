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
seed are in the output). What the request-side checks found in the server is kept below as plain regressions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from .conftest import MODEL

SEED = 20261130
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance,positive_data_acceptance,negative_data_rejection")
HOOKS = Path(__file__).resolve().parent / "schemathesis_hooks.py"


def test_every_generated_request_gets_a_documented_response_and_the_document_is_as_strict_as_the_server(
        gateway_url: str) -> None:
    st = Path(sys.executable).parent / "st"
    command = [str(st), "run", f"{gateway_url}/openapi.yaml", "--checks", CHECKS, "--max-examples", "25",
               "--seed", str(SEED), "--workers", "2", "--no-color", "--output-sanitize", "false",
               # how fast Hypothesis generates bodies says nothing about the server; on a loaded 2-core host the
               # multipart/batch schemas tripped it
               "--suppress-health-check", "too_slow"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-8000:]}\n{done.stderr[-2000:]}"


# -- what the request-side checks found, kept as plain regressions ------------------------------------------------
DECIDE = "decision-zeroshot"


def test_a_deadline_of_any_size_is_a_deadline_not_a_server_error(http: httpx.Client) -> None:
    """deadline_ms 1e308 overflowed the Unix-ns deadline (int(inf)) and answered 500."""
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": ["far"], "options": {"deadline_ms": 1e308}})
    assert r.status_code == 200 and "embedding" in r.json()["data"][0]


def test_question_text_with_integers_beyond_64_bits_is_read_not_a_server_error(http: httpx.Client) -> None:
    """Instructions given as JSON are read as canonical JSON; orjson refuses integers beyond 64 bits (it was 500)."""
    r = http.post("/v1/decisions", json={"model": DECIDE, "state": "Is this about billing?", "questions": {
        "q": {"type": "noul", "instructions": {"ask": "billing?", "id": 2**70}}}})
    assert r.status_code == 200 and r.json()["answers"]["q"]["type"] == "noul"


def test_a_bundle_task_with_options_null_is_refused_like_the_request_alone(http: httpx.Client) -> None:
    """The bundle's deadline used to replace `options: null` with an object, so the task was answered."""
    task = {"model": MODEL, "input": ["x"], "options": None}
    alone = http.post("/v1/embeddings", json=task)
    bundled = http.post("/v1/bundle", json={"tasks": [{"id": "a", "embeddings": task}],
                                            "options": {"deadline_ms": 9e3}})
    assert alone.status_code == 400
    assert bundled.status_code == 200 and bundled.json()["results"][0]["status"] == 400


def test_a_batch_entry_whose_videos_is_not_a_list_is_400(http: httpx.Client) -> None:
    """`states.<name>.videos: 6388` was passed to list() and answered 500."""
    r = http.post("/v1/decisions", json={"model": DECIDE, "states": {"a": {
        "state": "x", "questions": {"q": {"type": "noul", "instructions": "Is it?"}}, "videos": 6388}}})
    assert r.status_code == 400 and "states.a.videos must be a list" in r.json()["error"]["message"]


def test_the_served_document_holds_a_model_to_the_surfaces_its_card_lists(http: httpx.Client) -> None:
    """Another served model is 422 unsupported_surface: the served document's `model` enum leaves it out."""
    served = yaml.safe_load(http.get("/openapi.yaml").content)["components"]["schemas"]
    assert DECIDE in served["DecisionStandardRequest"]["properties"]["model"]["enum"]
    assert DECIDE not in served["EmbeddingsRequest"]["properties"]["model"]["enum"]
    assert http.post("/v1/embeddings", json={"model": DECIDE, "input": ["x"]}).status_code == 422
