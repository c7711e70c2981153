"""The result cache's key holds everything an answer depends on, so with `--result-cache all` (or for exact models)
two different requests never get each other's answers. The end-to-end check of part names is in
test_decisions_edges_api.py; this one covers what a served test cannot reach cheaply (images, places, budgets)."""

from __future__ import annotations

from pathlib import Path

from gateway.assets import Asset
from gateway.cards import discover
from gateway.decisions.cache import key
from gateway.decisions.families import Ask
from gateway.decisions.media import Picture
from gateway.decisions.questions import Question, validate
from gateway.decisions.state import parse_state
from gateway.metrics import Metrics
from gateway.runtime import Runtime, ServedModel
from gateway.settings import Settings

REPO = Path(__file__).resolve().parents[2] / "model_repository"
NOUL = {"type": "noul", "instructions": "Does the candidate help answer the request?"}


def model() -> ServedModel:
    return Runtime(Settings(model_repository=REPO), discover(REPO, ["decision-zeroshot"]), Metrics()).models[
        "decision-zeroshot"]


def question(raw: dict[str, object], qid: str = "q") -> Question:
    served = model()
    assert served.card.decisions is not None
    q = validate(qid, raw, served.card.decisions, served.id)
    assert isinstance(q, Question)
    return q


def ask(state: object, roles: object = None, pictures: tuple[bytes, ...] = (), own: int = 0,
        raw: dict[str, object] = NOUL) -> Ask:
    view = parse_state(state, roles).view(None)
    pics = [Picture(Asset(f"<{i}>", data), i + 1) for i, data in enumerate(pictures)]
    return Ask(None, question(raw), view, pictures=pics, own_pictures=pics[len(pics) - own:] if own else [])


def test_the_same_question_over_the_same_state_has_one_key() -> None:
    served = model()
    assert key(served, ask({"request": "a", "candidate": "b"}), None) == \
        key(served, ask({"request": "a", "candidate": "b"}), None)


def test_part_names_that_render_the_same_text_are_different_keys() -> None:
    served = model()
    paired, plain = ask({"request": "a", "candidate": "b"}), ask({"left": "a", "right": "b"})
    assert paired.view.text == plain.view.text and paired.view.parts == plain.view.parts  # roles null: no names
    assert key(served, paired, None) != key(served, plain, None)


def test_different_image_bytes_behind_the_same_text_are_different_keys() -> None:
    served = model()
    one, other = ask("[image 1] What is this?", pictures=(b"png one",)), ask("[image 1] What is this?",
                                                                             pictures=(b"png two",))
    assert one.view.text == other.view.text
    assert key(served, one, None) != key(served, other, None)
    assert key(served, one, None) == key(served, ask("[image 1] What is this?", pictures=(b"png one",)), None)


def test_an_image_in_the_question_and_the_same_image_in_the_state_are_different_keys() -> None:
    served = model()
    box = {"type": "box", "instructions": "the total"}
    in_state = ask("[image 1] [image 2]", pictures=(b"a", b"b"), raw=box)
    in_question = ask("[image 1] [image 2]", pictures=(b"a", b"b"), own=1, raw=box)
    assert key(served, in_state, None) != key(served, in_question, None)


def test_the_budget_and_the_parts_a_question_reads_are_in_the_key() -> None:
    served = model()
    base = ask({"request": "a", "candidate": "b"})
    assert key(served, base, None) != key(served, base, 64)
    over = ask({"request": "a", "candidate": "b"}, raw={**NOUL, "over": ["request", "candidate"]})
    assert key(served, base, None) != key(served, over, None)
