"""Edges of decisions requests that need no model: Server-Timing over every model call, data URLs of any image type,
and the OpenAPI document declaring multipart bodies wherever the server reads them."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from gateway.assets import Assets
from gateway.cards import discover
from gateway.decisions.families import Phases
from gateway.decisions.media import substitute
from gateway.decisions.request import parse_request
from gateway.decisions.running import Plan, finish
from gateway.errors import ApiError
from gateway.metrics import Metrics
from gateway.runtime import Runtime
from gateway.settings import Settings
from gateway.timing import Timing

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"
PNG = bytes.fromhex("89504e470d0a1a0a")  # the bytes are read for their format later; only the URL is checked here


def test_server_timing_charges_every_model_call_of_a_decisions_request() -> None:
    """OCR, then the encoder, then the tagger: queue and forward are their sums, not the last call's."""
    runtime = Runtime(Settings(model_repository=REPO), discover(REPO, ["decision-zeroshot"]), Metrics())
    model = runtime.models["decision-zeroshot"]
    timing = Timing()
    req = parse_request({"model": model.id, "state": "x", "questions": {"q": {"type": "noul", "instructions": "i"}}})
    p = Plan(model, req, [], [], timing, timing.started,
             phases=[Phases(1.0, 10.0, 3.0), Phases(2.0, 20.0, 1.0), Phases(4.0, 40.0, 2.0)])
    answered = finish(runtime, p)
    assert (timing.ms["queue"], timing.ms["forward"]) == (7.0, 70.0)
    assert (answered.queue_ms, answered.forward_ms) == (7.0, 70.0)  # meta.queue_ms / compute_ms alike


@pytest.mark.parametrize("kind", ["png", "jpeg", "webp", "gif", "x-portable-anymap", "vnd.microsoft.icon"])
def test_a_data_url_of_any_image_type_is_taken_and_its_format_read_from_the_bytes(kind: str) -> None:
    url = f"data:image/{kind};base64,{base64.b64encode(PNG).decode()}"
    media = substitute(Assets(), "[image 1]", {"q": {"type": "noul", "instructions": "i"}}, [url], "")
    assert [p.asset.data for p in media.images] == [PNG]


@pytest.mark.parametrize("url", ["data:text/plain;base64,aGk=", "data:image/png,notbase64", "https://x/a.png",
                                 "data:image/png;base64,@@@"])
def test_a_data_url_that_is_not_a_base64_image_is_a_400(url: str) -> None:
    with pytest.raises(ApiError) as refused:
        substitute(Assets(), "[image 1]", {}, [url], "")
    assert refused.value.code == "invalid_request" and "images[0]" in refused.value.message


def test_the_document_declares_multipart_bodies_for_every_endpoint_that_reads_them() -> None:
    doc = yaml.safe_load((ROOT / "gateway" / "openapi.yaml").read_text())
    reads_parts = ["/v1/decisions", "/v1/systemone", "/v1/systemone/batch", "/v1/bundle", "/v1/embeddings",
                   "/v1/classify"]
    for path in reads_parts:
        content = doc["paths"][path]["post"]["requestBody"]["content"]
        assert set(content) == {"application/json", "multipart/form-data"}, path
        schema = doc["components"]["schemas"][content["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]]
        assert schema["properties"]["request"] == content["application/json"]["schema"], path
        assert content["multipart/form-data"]["encoding"]["request"]["contentType"] == "application/json"
    for path in ("/v1/rerank", "/v2/rerank"):
        assert set(doc["paths"][path]["post"]["requestBody"]["content"]) == {"application/json"}
