"""The typed error codes and the OpenAPI document agree, and every route answers errors in the API's format."""

from __future__ import annotations

from typing import get_args

import httpx

from gateway.errors import QUESTION_STATUS, STATUS, ErrorCode, ItemCode, QuestionCode

from .contract import document


def _enum(name: str) -> set[str]:
    schema = document()["components"]["schemas"][name]
    return set(schema.get("enum") or schema["properties"]["code"]["enum"])


def test_the_contract_lists_exactly_the_request_level_codes_and_each_has_a_status() -> None:
    assert _enum("ErrorBody") == set(get_args(ErrorCode)) == set(STATUS)


def test_the_contract_lists_exactly_the_item_codes_of_each_surface() -> None:
    assert _enum("ItemError") == set(get_args(ItemCode))
    assert _enum("DecisionItemError") == set(get_args(ItemCode)) | set(get_args(QuestionCode)) == set(QUESTION_STATUS)


def test_a_wrong_method_is_405_with_allow_and_an_unknown_path_404_both_in_json(http: httpx.Client) -> None:
    wrong = http.get("/v1/decisions")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "invalid_request"
    assert "POST" in wrong.headers["Allow"]
    unknown = http.post("/v1/nothing", json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == "no route /v1/nothing"


def test_a_body_error_shows_its_time_in_parse_and_a_validation_error_in_tokenize(http: httpx.Client) -> None:
    from .contract import timings

    broken = http.post("/v1/embeddings", content=b'{"input": ' + b'"x",' * 20000, headers={
        "Content-Type": "application/json"})
    assert broken.status_code == 400 and timings(broken)["parse"] > 0
    invalid = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": 5})
    assert invalid.status_code == 400 and timings(invalid)["tokenize"] > 0


def test_meta_names_the_precision_and_the_device_the_model_ran_on(http: httpx.Client) -> None:
    r = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": "x", "options": {"return_meta": True}})
    assert r.json()["meta"]["device"] == "cpu"  # read from the Triton config's KIND_CPU instance groups
    card = next(c for c in http.get("/v1/models").json()["data"] if c["id"] == "all-minilm-l6-v2")
    assert card["device"] == "cpu"
    # the accelerator names the hardware (test_accelerator.py checks its text against /proc/cpuinfo)
    assert card["accelerator"] == r.json()["meta"]["accelerator"] != "cpu"
    assert r.json()["meta"]["dtype"] == card["dtype"] and r.json()["meta"]["engine"] == card["engine"]
