"""Decisions at the edges, through the real stack on the session's Triton. Requests that hold several requests —
/v1/bundle tasks, /v1/systemone/batch requests, /v1/decisions `states` — answer each one as if it had been sent
alone: multipart parts reach the request whose asset names them, top-level `roles` that one entry cannot take fail
that entry, admission is per request, the result cache never answers one request with another's answer; and usage
says when a state was read only in part.

Three gateways share the session's Triton, each serving only the models these tests read (so a model elsewhere in
the repository that fails its readiness does not hold them up): one with the default settings, one caching every
model's answers (`--result-cache all`) and one with a small --max-queue, so admission limits are reached with small
requests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.cards import discover

from .conftest import ROOT, serve_gateway
from .contract import check
from .precision import golden_tolerance
from .test_decisions_images_api import blank_png, receipt_png

MODEL = "decision-zeroshot"
SMALL_QUEUE = 64
NOUL = {"type": "noul", "instructions": "Does the candidate passage help answer the request?"}
RECEIPT = {"type": "choice", "instructions": "What is this document?",
           "choices": [{"key": "receipt", "description": "A shop receipt with prices"},
                       {"key": "letter", "description": "A personal letter"}]}
MODELS = "all-minilm-l6-v2,pii-rampart,decision-zeroshot,ppocr-v4"


def _serve(triton_url: str, name: str, *flags: str) -> Iterator[str]:
    yield from serve_gateway(triton_url, name, "--models", MODELS, *flags, timeout=300)


@pytest.fixture(scope="module")
def served(triton_url: str) -> Iterator[str]:
    yield from _serve(triton_url, "gateway-decisions-edges.log")


@pytest.fixture(scope="module")
def cached(triton_url: str) -> Iterator[str]:
    yield from _serve(triton_url, "gateway-decisions-edges-cache-all.log", "--result-cache", "all")


@pytest.fixture(scope="module")
def small(triton_url: str) -> Iterator[str]:
    yield from _serve(triton_url, "gateway-decisions-edges-queue.log", "--max-queue", str(SMALL_QUEUE))


def tolerance() -> float:
    return golden_tolerance(discover(ROOT / "model_repository", [MODEL])[0])


def post(url: str, path: str, body: Any = None, status: int = 200, files: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    r = httpx.post(url + path, json=body, timeout=120) if files is None else httpx.post(url + path, files=files,
                                                                                        timeout=120)
    assert r.status_code == status, r.text
    check(path, "post", r.status_code, r.json(), r.headers)
    return r.json()  # type: ignore[no-any-return]


def multipart(request: dict[str, Any], **parts: bytes) -> dict[str, Any]:
    return {"request": (None, json.dumps(request), "application/json"),
            **{name: (f"{name}.png", data, "image/png") for name, data in parts.items()}}


def receipt_task(part: str = "scan") -> dict[str, Any]:
    return {"model": MODEL, "state": {"receipt": "<r>", "note": "Uploaded by the customer."},
            "assets": {"<r>": {"type": "image", "part": part}}, "questions": {"kind": RECEIPT}}


def with_base64(task: dict[str, Any], data: bytes) -> dict[str, Any]:
    import base64

    return {**task, "assets": {"<r>": {"type": "image", "data_base64": base64.b64encode(data).decode()}}}


# -- result cache ------------------------------------------------------------------------------------------------
def test_the_result_cache_tells_apart_states_that_differ_only_in_part_names(cached: str, served: str) -> None:
    """With roles null both states render the same text; only the names switch the pair term."""
    parts = ("How long is the refund window?", "Refunds are accepted within 30 days of purchase.")
    paired = {"model": MODEL, "roles": None, "state": dict(zip(("request", "candidate"), parts, strict=True)),
              "questions": {"q": NOUL}}
    plain = {**paired, "state": dict(zip(("left", "right"), parts, strict=True))}
    first = post(cached, "/v1/decisions", paired)["answers"]["q"]["noul"]
    second = post(cached, "/v1/decisions", plain)["answers"]["q"]["noul"]
    fresh = post(served, "/v1/decisions", plain)["answers"]["q"]["noul"]  # default settings: approximate uncached
    assert abs(first - fresh) > 0.05  # the pair term moves the answer: a cached copy would show
    assert abs(second - fresh) <= tolerance()


# -- multipart bodies holding several requests -------------------------------------------------------------------
def test_a_bundle_task_reads_the_multipart_part_its_asset_names(served: str) -> None:
    body = {"tasks": [{"id": "scan", "decisions": receipt_task()},
                      {"id": "text", "decisions": {"model": MODEL, "state": "hi", "questions": {"q": NOUL}}}]}
    results = post(served, "/v1/bundle", files=multipart(body, scan=receipt_png()))["results"]
    assert [r["status"] for r in results] == [200, 200], results
    alone = post(served, "/v1/decisions", with_base64(receipt_task(), receipt_png()))
    assert results[0]["decisions"]["answers"]["kind"]["choice"] == alone["answers"]["kind"]["choice"] == "receipt"
    got, want = (x["answers"]["kind"]["probabilities"]["receipt"] for x in (results[0]["decisions"], alone))
    assert abs(got - want) <= tolerance()


@pytest.mark.parametrize(("tasks", "parts", "message"), [
    ([receipt_task("scan")], ["scan", "extra"], "multipart part 'extra' is not referenced by any asset"),
    ([receipt_task("scan"), receipt_task("scan")], ["scan"], "is referenced by task 'a' and 'b'"),
])
def test_a_bundle_with_a_part_no_asset_or_two_tasks_name_is_a_400(served: str, tasks: list[dict[str, Any]],
                                                                   parts: list[str], message: str) -> None:
    body = {"tasks": [{"id": chr(ord("a") + i), "decisions": t} for i, t in enumerate(tasks)]}
    r = post(served, "/v1/bundle", files=multipart(body, **dict.fromkeys(parts, blank_png())), status=400)
    assert r["error"]["code"] == "invalid_request" and message in r["error"]["message"]


def test_a_task_naming_a_part_the_body_lacks_fails_alone(served: str) -> None:
    body = {"tasks": [{"id": "a", "decisions": receipt_task("scan")},
                      {"id": "b", "decisions": receipt_task("missing")}]}
    results = post(served, "/v1/bundle", files=multipart(body, scan=receipt_png()))["results"]
    assert [r["status"] for r in results] == [200, 400]
    assert "names part 'missing', which the body does not have" in results[1]["error"]["message"]


def test_a_systemone_batch_request_reads_the_multipart_part_its_asset_names(served: str) -> None:
    body = {"requests": {"scan": receipt_task(), "text": {"model": MODEL, "state": "hi",
                                                         "questions": {"q": NOUL}}}}
    responses = post(served, "/v1/systemone/batch", files=multipart(body, scan=receipt_png()))["responses"]
    assert responses["scan"]["status"] == responses["text"]["status"] == 200, responses
    assert responses["scan"]["body"]["answers"]["kind"]["choice"] == "receipt"
    unreferenced = post(served, "/v1/systemone/batch", files=multipart(body, scan=receipt_png(),
                                                                            extra=blank_png()), status=400)
    assert unreferenced["code"] == "invalid_request" and "'extra' is not referenced" in unreferenced["detail"]


# -- top-level roles ---------------------------------------------------------------------------------------------
def test_roles_naming_a_part_one_entry_lacks_fail_that_entry_only(served: str) -> None:
    body = {"model": MODEL, "roles": {"request": "user", "candidate": "document"},
            "states": {"both": {"state": {"request": "Refund window?", "candidate": "30 days."},
                                "questions": {"q": NOUL}},
                       "one": {"state": {"request": "Refund window?"}, "questions": {"q": NOUL}}}}
    states = post(served, "/v1/decisions", body)["states"]
    assert 0 <= states["both"]["answers"]["q"]["noul"] <= 1
    failed = states["one"]["answers"]["q"]
    assert failed["error"] == "invalid_input" and "roles names parts the state does not have" in failed["message"]
    alone = post(served, "/v1/decisions", {"model": MODEL, "roles": body["roles"], **body["states"]["one"]},
                 status=400)
    assert alone["error"]["message"] == failed["message"]


# -- rejected entries --------------------------------------------------------------------------------------------
def test_an_entry_over_max_request_tokens_fails_its_questions_as_input_malformed(served: str) -> None:
    """Spec: an entry rejected for its token count fails each question with invalid_input, reason input_malformed;
    alone, the request fails as a whole with reason request_tokens and the limit."""
    long = {"state": "word " * 70000, "questions": {"q": {**NOUL, "overflow": "truncate"}}}
    batch = {"model": MODEL, "states": {"long": long, "short": {"state": "hi", "questions": {"q": NOUL}}}}
    r = post(served, "/v1/systemone", batch, status=400)
    assert r["code"] == "question_failed" and r["question_error"] == "invalid_input"
    assert r["reason"] == "input_malformed" and r["state"] == "long"
    alone = post(served, "/v1/systemone", {"model": MODEL, **long}, status=400)
    assert alone["code"] == "invalid_request" and alone["reason"] == "request_tokens" and alone["limit"] == 65536


def test_an_unreadable_image_in_an_invalid_question_is_never_decoded(served: str) -> None:
    import base64

    body = {"model": MODEL, "state": "What is this document?",
            "assets": {"<bad>": {"type": "image", "data_base64": base64.b64encode(b"not an image").decode()}},
            "questions": {"ok": RECEIPT, "broken": {"type": "noul", "instructions": "Is <bad> a receipt?",
                                                    "colour": "red"}}}
    answers = post(served, "/v1/decisions", body)["answers"]
    assert answers["broken"]["error"] == "invalid_question" and "choice" in answers["ok"]
    valid = {**body, "questions": {"ok": RECEIPT, "broken": {"type": "noul", "instructions": "Is <bad> one?"}}}
    rejected = post(served, "/v1/decisions", valid, status=400)  # read by a valid question: the request fails
    assert "asset '<bad>'" in rejected["error"]["message"]


# -- admission ---------------------------------------------------------------------------------------------------
def states(count: int, tag: str) -> dict[str, Any]:
    return {str(i): {"state": f"{tag} {i}: how do I reset the password of account {i * 7919}?",
                     "questions": {"q": NOUL}} for i in range(count)}


def test_each_systemone_batch_request_is_admitted_as_if_sent_alone(small: str) -> None:
    """Three requests of 25 inputs fit --max-queue 64 one by one, not together; one of 70 never fits."""
    fits = {f"fits{k}": {"model": MODEL, "states": states(25, f"fits{k}")} for k in range(3)}
    never = {"never": {"model": MODEL, "states": states(SMALL_QUEUE + 6, "never")}}
    responses = post(small, "/v1/systemone/batch", {"requests": {**fits, **never}})["responses"]
    assert {name: r["status"] for name, r in responses.items()} == {"fits0": 200, "fits1": 200, "fits2": 200,
                                                                     "never": 413}, responses
    assert responses["never"]["body"]["code"] == "request_too_large"
    assert "--max-queue" in responses["never"]["body"]["detail"]


# -- usage -------------------------------------------------------------------------------------------------------
TRUNCATED = {"type": "noul", "instructions": "Is this about billing?", "overflow": "truncate"}


def test_a_state_read_in_part_counts_the_tokens_read_as_a_lower_bound(served: str) -> None:
    """Spec (long inputs): an input read only in part counts the tokens read, more than the budget, with
    tokens_lower_bound."""
    usage = post(served, "/v1/decisions", {"model": MODEL, "state": "billing " * 3000,
                                           "questions": {"q": TRUNCATED}})["usage"]
    assert usage["tokens_lower_bound"] is True and usage["input_tokens"] > 256  # truncate_tokens: 256


def test_a_state_read_whole_has_no_lower_bound(served: str) -> None:
    usage = post(served, "/v1/decisions", {"model": MODEL, "state": "My card was charged twice.",
                                           "questions": {"q": TRUNCATED}})["usage"]
    assert "tokens_lower_bound" not in usage and usage["input_tokens"] > 0


def test_a_batch_says_lower_bound_where_one_entry_was_read_in_part(served: str) -> None:
    body = post(served, "/v1/decisions", {"model": MODEL, "states": {
        "long": {"state": "billing " * 3000, "questions": {"q": TRUNCATED}},
        "short": {"state": "hi", "questions": {"q": TRUNCATED}}}})
    assert body["states"]["long"]["usage"]["tokens_lower_bound"] is True
    assert "tokens_lower_bound" not in body["states"]["short"]["usage"]
    assert body["usage"]["tokens_lower_bound"] is True
    assert body["usage"]["input_tokens"] == sum(s["usage"]["input_tokens"] for s in body["states"].values())
