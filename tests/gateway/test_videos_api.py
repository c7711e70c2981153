"""Videos in /v1/decisions and /v1/systemone through the real app with the fake engine behind the Triton seam: the
rules and limits a request meets before any model reads a frame (malformed containers, `at` and `rate`, which
video, `box_video_too_long` and `video_max_seconds` at their edges, the frame budget, `track_unsupported`).

The fake engine is no OCR model: questions that pass every rule reach the OCR step and fail there as
`unavailable` (ppocr-v4 is not served here), which these tests read as "accepted". Reading real frames through the
served OCR is tests/gateway/test_videos_triton.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import cache
from typing import Any, cast

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.decisions.families import family
from gateway.decisions.media import EntryMedia, video_question
from gateway.decisions.questions import Question, QuestionError
from gateway.runtime import ServedModel
from gateway.settings import Settings
from gateway.surfaces.common import RUNTIME_KEY
from gateway.surfaces.info import served_document

from .conftest import ROOT
from .contract import check
from .fake_engine import served_by_fake
from .test_videos_units import MALFORMED, REASONS, data_url, video

MODEL = "decision-zeroshot"
NOUL = {"type": "noul", "instructions": "Is this about a station?"}
TRACK = {"type": "track", "instructions": "the exit sign"}


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    """One app for the module: every test here only reads it (the one that changes the family restores it)."""
    async with served_by_fake(MODEL) as (served, _engine):
        yield served


@cache
def seconds_long(seconds: float, fps: int = 2) -> str:
    """A tiny video `seconds` long (whole frames at `fps`), as a data URL."""
    return data_url(video(round(seconds * fps), fps, width=16, height=16))


async def post(client: TestClient, body: dict[str, Any], status: int = 200,  # type: ignore[type-arg]
               path: str = "/v1/decisions") -> dict[str, Any]:
    r = await client.post(path, json={"model": MODEL, **body})
    got = await r.json()
    assert r.status == status, got
    if path == "/v1/decisions":
        check(path, "post", r.status, got, r.headers)
    return cast(dict[str, Any], got)


def accepted(answer: dict[str, Any]) -> bool:
    """Passed every rule: answered, or failed only where the fake engine has no OCR model to read the frames
    (every question of an entry with a video reads frames: locating ones their moments, others an overview)."""
    return "error" not in answer or (answer["error"] == "unavailable" and "ppocr-v4" in answer["message"])


@pytest.mark.parametrize("kind", sorted(MALFORMED))
async def test_each_malformed_container_fails_the_request_naming_the_video(client: TestClient,  # type: ignore[type-arg]
                                                                           kind: str) -> None:
    r = await post(client, {"state": "the platform", "videos": [data_url(MALFORMED[kind]())],
                            "questions": {"q": NOUL}}, status=400)
    assert r["error"]["code"] == "invalid_request"
    assert r["error"]["message"].startswith("videos[0]: ") and REASONS[kind] in r["error"]["message"]


async def test_in_a_batch_a_malformed_video_fails_only_its_entrys_questions(client: TestClient  # type: ignore[type-arg]
                                                                            ) -> None:
    r = await post(client, {"states": {
        "bad": {"state": "a", "videos": [data_url(MALFORMED["audio only"]())], "questions": {"q": NOUL}},
        "good": {"state": "b", "videos": [seconds_long(2)], "questions": {"q": NOUL}}}})
    bad = r["states"]["bad"]["answers"]["q"]
    assert bad["error"] == "invalid_input" and "states.bad.videos[0]" in bad["message"]
    assert accepted(r["states"]["good"]["answers"]["q"])


@pytest.mark.parametrize("value", ["https://example.org/clip.mp4", "data:video/mp4;base64,***"])
async def test_a_videos_entry_that_is_not_a_base64_data_url_fails_the_request(client: TestClient,  # type: ignore[type-arg]
                                                                             value: str) -> None:
    r = await post(client, {"state": "x", "videos": [value], "questions": {"q": NOUL}}, status=400)
    assert "videos[0]" in r["error"]["message"]


async def test_box_at_a_moment_and_track_over_a_readable_video_pass_every_rule(client: TestClient  # type: ignore[type-arg]
                                                                               ) -> None:
    r = await post(client, {"state": "the platform", "videos": [seconds_long(3)], "questions": {
        "at": {"type": "box", "instructions": "the exit sign", "at": 2.5}, "track": TRACK, "q": NOUL}})
    assert accepted(r["answers"]["at"]) and accepted(r["answers"]["track"]), r["answers"]
    assert accepted(r["answers"]["q"])


@pytest.mark.parametrize(("seconds", "too_long"), [(30.0, False), (30.5, True)])
async def test_box_video_max_seconds_bounds_locating_questions_at_its_edge(client: TestClient,  # type: ignore[type-arg]
                                                                         seconds: float, too_long: bool) -> None:
    r = await post(client, {"state": "the platform", "videos": [seconds_long(seconds)], "questions": {
        "at": {"type": "box", "instructions": "the exit sign", "at": 1}, "track": TRACK, "q": NOUL}})
    for qid in ("at", "track"):
        answer = r["answers"][qid]
        if too_long:
            assert answer["error"] == "box_video_too_long" and "30 s" in answer["message"], answer
        else:
            assert accepted(answer), answer
    assert accepted(r["answers"]["q"])  # 30.5 s is within video_max_seconds (300): the entry is read


async def test_a_video_whose_container_gives_no_length_fails_locating_questions_as_too_long(
        client: TestClient) -> None:  # type: ignore[type-arg]
    live = data_url(video(4, 2, fmt="matroska", options={"live": "1"}), "webm")
    r = await post(client, {"state": "s", "videos": [live], "questions": {"track": TRACK, "q": NOUL}})
    assert r["answers"]["track"]["error"] == "box_video_too_long"
    assert "does not give" in r["answers"]["track"]["message"]
    assert accepted(r["answers"]["q"])


async def test_systemone_answers_a_too_long_video_as_the_requests_400(client: TestClient  # type: ignore[type-arg]
                                                                      ) -> None:
    r = await post(client, {"state": "s", "videos": [seconds_long(31)], "questions": {"track": TRACK}},
                   status=400, path="/v1/systemone")
    assert r["code"] == "question_failed" and r["question_error"] == "box_video_too_long"  # System One 5.0: flat
    assert "31 s" in r["detail"] and r["question"] == "track"


@pytest.mark.parametrize(("seconds", "rejected"), [(300.0, False), (301.0, True)])
async def test_video_max_seconds_bounds_an_entry_whose_other_questions_read_it(client: TestClient,  # type: ignore[type-arg]
                                                                              seconds: float, rejected: bool) -> None:
    body = {"state": "s", "videos": [seconds_long(seconds, fps=1)], "questions": {"q": NOUL}}
    r = await post(client, body, status=400 if rejected else 200)
    if rejected:
        assert "video_max_seconds" in r["error"]["message"] and "301 s" in r["error"]["message"]
    else:
        assert accepted(r["answers"]["q"])


@pytest.mark.parametrize(("question", "message"), [
    ({"type": "box", "instructions": "x", "at": -1}, "at must be"),
    ({"type": "box", "instructions": "x", "at": "2"}, "at must be"),
    ({"type": "box", "instructions": "x", "at": True}, "at must be"),
    ({"type": "track", "instructions": "x", "rate": 3}, "rate must be 1 or 2"),
    ({"type": "track", "instructions": "x", "rate": 1.5}, "rate must be 1 or 2"),
    ({"type": "track", "instructions": "x", "at": 1}, "do not take ['at']"),
    ({"type": "box", "instructions": "x", "at": 3.5}, "past the end of the video (3 s)"),
])
async def test_a_malformed_moment_fails_its_question_alone(client: TestClient,  # type: ignore[type-arg]
                                                          question: dict[str, Any], message: str) -> None:
    r = await post(client, {"state": "s", "videos": [seconds_long(3)], "questions": {"b": question, "q": NOUL}})
    assert r["answers"]["b"]["error"] == "invalid_question" and message in r["answers"]["b"]["message"]
    assert accepted(r["answers"]["q"])


async def test_at_the_very_end_of_the_video_reads_its_last_frame(client: TestClient  # type: ignore[type-arg]
                                                                  ) -> None:
    r = await post(client, {"state": "s", "videos": [seconds_long(3)], "questions": {
        "b": {"type": "box", "instructions": "x", "at": 3}, "q": NOUL}})
    assert accepted(r["answers"]["b"]), r["answers"]["b"]


@pytest.mark.parametrize(("videos", "code"), [(0, "box_needs_image"), (2, "box_target_ambiguous")])
async def test_locating_questions_need_exactly_one_video(client: TestClient,  # type: ignore[type-arg]
                                                         videos: int, code: str) -> None:
    r = await post(client, {"state": "s", "videos": [seconds_long(2)] * videos, "questions": {
        "track": TRACK, "at": {"type": "box", "instructions": "x", "at": 1}, "q": NOUL}})
    assert r["answers"]["track"]["error"] == code and r["answers"]["at"]["error"] == code
    assert accepted(r["answers"]["q"])


async def test_one_request_samples_at_most_its_frame_budget(client: TestClient  # type: ignore[type-arg]
                                                             ) -> None:
    fast = {"type": "track", "instructions": "the exit sign", "rate": 2}  # 30 s at rate 2: 60 of the 64 frames
    r = await post(client, {"states": {
        "first": {"state": "a", "videos": [seconds_long(30)], "questions": {"t": fast}},
        "second": {"state": "b", "videos": [seconds_long(30)], "questions": {"t": fast}}}})
    assert accepted(r["states"]["first"]["answers"]["t"])
    second = r["states"]["second"]["answers"]["t"]
    assert second["error"] == "invalid_input" and "at most 64" in second["message"]


async def test_a_longest_track_at_rate_two_beside_other_questions_fills_the_budget_exactly(
        client: TestClient) -> None:  # type: ignore[type-arg]
    r = await post(client, {"state": "a", "videos": [seconds_long(30)], "questions": {
        "t": {"type": "track", "instructions": "the exit sign", "rate": 2}, "q": NOUL}})  # 60 + 4 = 64 frames
    assert accepted(r["answers"]["t"]) and accepted(r["answers"]["q"])


async def test_a_track_question_on_a_card_whose_family_cannot_locate_answers_track_unsupported(
        client: TestClient) -> None:  # type: ignore[type-arg]
    served: ServedModel = cast(TestServer, client.server).app[RUNTIME_KEY].models[MODEL]
    fam = family(served)
    kept = fam.params
    fam.params = kept.model_copy(update={"ocr": None})  # the card lists track, its family reads no frames
    try:
        r = await post(client, {"state": "s", "videos": [seconds_long(2)], "questions": {"track": TRACK, "q": NOUL}})
    finally:
        fam.params = kept
    assert r["answers"]["track"]["error"] == "track_unsupported"  # in place, never a 500
    other = r["answers"]["q"]  # it would read the video's frames too: said so, not answered as if it had none
    assert other["error"] == "unavailable" and "reads no frames" in other["message"]


@pytest.mark.parametrize(("qtype", "code"), [("track", "track_unsupported"), ("box", "box_unsupported")])
async def test_a_model_that_reads_no_videos_refuses_locating_questions(client: TestClient,  # type: ignore[type-arg]
                                                                       qtype: str, code: str) -> None:
    served: ServedModel = cast(TestServer, client.server).app[RUNTIME_KEY].models[MODEL]
    no_video = cast(ServedModel, type("Model", (), {"id": "text-and-images", "card": served.card.model_copy(
        update={"modalities": ["text", "image"]})})())
    question = Question("q", qtype, "the exit sign", extra={"at": 1.0} if qtype == "box" else {})
    with pytest.raises(QuestionError) as caught:
        video_question(no_video, family(served), question, EntryMedia("s", {}, videos=[seconds_long(2)]))
    assert caught.value.code == code and "reads no videos" in str(caught.value)


@pytest.mark.parametrize(("model", "reads_videos"), [(MODEL, True), ("decision-multilingual", False)])
def test_the_served_contract_allows_videos_only_where_a_served_card_reads_them(model: str,
                                                                             reads_videos: bool) -> None:
    runtime = create_app(Settings(model_repository=ROOT / "model_repository", models=model),
                         start_models=False)[RUNTIME_KEY]
    runtime.models[model].load_tokenizer()
    schemas = yaml.safe_load(served_document(runtime))["components"]["schemas"]
    assert ("maxItems" not in schemas["DecisionVideos"]) is reads_videos
    assert ("at" in schemas["BoxQuestion"]["properties"]) is reads_videos
    for form in ("DecisionStandardRequest", "DecisionStateEntry"):
        assert schemas[form]["properties"]["videos"] == {"$ref": "#/components/schemas/DecisionVideos"}
