"""A request's entries: each state with its questions, validated, its images decoded and its tokens bounded.

A standard request is one entry (name None); a batch (`states`) is one named entry per state, each read exactly as
if sent alone with the batch's model, options and assets. Failures stay where they happen: an invalid question
fails alone; a rejected entry (its images, videos, roles or token count) fails only its own questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..assets import Assets
from ..errors import ApiError
from ..runtime import ServedModel
from .families import Ask, Family, family
from .media import EntryMedia, decode, reads_video, substitute, video_question
from .questions import Invalid, Question, QuestionError, check_collisions, validate
from .request import DecisionRequest
from .state import OMITTED, State, parse_state

ENTRY_FIELDS = {"state", "questions", "images", "videos"}


@dataclass
class Entry:
    """One state with its questions, validated; `rejected` fails every question of the entry."""

    name: str | None
    state: State | None
    questions: list[Question | Invalid]
    rejected: ApiError | None = None
    asks: list[Ask] = field(default_factory=list)
    media: EntryMedia | None = None


def build_entries(model: ServedModel, req: DecisionRequest, parts: dict[str, bytes] | None = None, *,
                  leading: bool = False) -> list[Entry]:
    """The request's entries with their questions validated; a malformed request as a whole raises ApiError.
    `parts`: a multipart body's image parts; `leading`: System One's array states with images before the text."""
    fam = family(model)
    roles = _roles(req)
    assets = Assets.parse(req.assets, parts)
    if "states" not in req.model_fields_set:
        media = substitute(assets, req.state, req.questions, req.images, "", leading=leading)
        media.videos = list(req.videos or [])
        assets.check_all_used()
        return [_entry(model, fam, None, media, roles)]
    if not isinstance(req.states, dict) or not req.states:
        raise ApiError("invalid_request", "states must be an object naming at least one state")
    entries = []
    for name, raw in req.states.items():
        if not name.strip():
            raise ApiError("invalid_request", "states has a blank state name")
        if not isinstance(raw, dict):
            raise ApiError("invalid_request", f"states.{name} must be an object with state and questions")
        unknown = sorted(set(raw) - ENTRY_FIELDS)
        if unknown:
            raise ApiError("invalid_request", f"states.{name} does not take {unknown}")
        for needed in ("state", "questions"):
            if needed not in raw:
                raise ApiError("invalid_request", f"states.{name}.{needed} is required")
        media = substitute(assets, raw["state"], raw["questions"], raw.get("images"), f"states.{name}.",
                           leading=leading)
        videos = raw.get("videos")
        if videos is not None and not isinstance(videos, list):
            raise ApiError("invalid_request", f"states.{name}.videos must be a list")
        media.videos = list(videos or [])
        entries.append(_entry(model, fam, name, media, roles))
    assets.check_all_used()
    return entries


def _roles(req: DecisionRequest) -> Any:
    return req.roles if "roles" in req.model_fields_set else OMITTED


def _questions(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw:
        raise ApiError("invalid_request", f"{where} must be an object naming at least one question")
    blank = [k for k in raw if not k.strip()]
    if blank:
        raise ApiError("invalid_request", f"{where} has a blank question id")
    return raw


def _entry(model: ServedModel, fam: Family, name: str | None, media: EntryMedia, roles: Any) -> Entry:
    where = "questions" if name is None else f"states.{name}.questions"
    questions = _questions(media.questions, where)
    state, roles_error = _state(media.state, roles, "state" if name is None else f"states.{name}.state")
    spec = model.card.decisions
    assert spec is not None
    placements = set(model.card.image_placements)
    checked: list[Question | Invalid] = []
    for qid, raw in questions.items():
        q = validate(qid, raw, spec, model.id)
        if isinstance(q, Question):
            try:
                fam.check(q)
                state.span_view(q.over) if q.type == "span" else state.view(q.over)
                if reads_video(q):
                    q = video_question(model, fam, q, media)
                elif q.type == "box":
                    _box_target(model, q, media)
                outside = media.question_places.get(qid, set()) - placements
                if outside:
                    raise QuestionError(f"images in a question's {sorted(outside)} are read only by models whose "
                                        f"image_placements list them; model {model.id} reads images in "
                                        f"{sorted(placements) or 'none'}", "question_images_unsupported")
            except QuestionError as exc:
                q = Invalid(qid, q.type, str(exc), exc.code)
        checked.append(q)
    entry = Entry(name, state, check_collisions(checked), rejected=roles_error, media=media)
    modalities = list(model.card.modalities or ["text"])
    # Images in the state need the modality; images in a question fail that question by placement (above).
    used = {"images": bool(media.images), "videos": bool(media.videos)}
    for kind, present in used.items():
        if present and kind.rstrip("s") not in modalities:
            entry.rejected = ApiError("invalid_request", f"model {model.id} does not read {kind}; it reads "
                                                         f"{modalities}")
    return entry


def _state(value: Any, roles: Any, where: str) -> tuple[State, ApiError | None]:
    """The entry's state, and the rejection of the request's `roles` for it: top-level roles apply to every entry
    of a batch, so roles naming a part one entry lacks reject that entry (alone: the request), not the batch."""
    try:
        return parse_state(value, roles, where=where), None
    except ApiError as exc:
        if roles is OMITTED or roles is None:
            raise
        try:
            state = parse_state(value, None, where=where)
        except ApiError:
            raise exc from None
        return state, exc


def _box_target(model: ServedModel, q: Question, media: EntryMedia) -> None:
    """A box question locates what its instructions describe in the one image they reference, else in the
    state's only image (with `at`, in the state's video: media.video_question)."""
    own = media.question_images.get(q.id, [])
    if len(own) > 1:
        raise QuestionError(f"the instructions reference {len(own)} images; a box question locates in one",
                            "box_target_ambiguous")
    if not own and len(media.images) > 1:
        raise QuestionError(f"the state holds {len(media.images)} images; reference the one to search in the "
                            "instructions", "box_target_ambiguous")
    if not own and not media.images:
        raise QuestionError("a box question needs an image: in its instructions or the state", "box_needs_image")


async def decode_images(model: ServedModel, entries: list[Entry]) -> None:
    """Decode each entry's images; a rejected image fails its entry (or, alone, the request) naming the asset."""
    for entry in entries:
        if entry.rejected is not None or entry.media is None:
            continue
        valid = {q.id for q in entry.questions if isinstance(q, Question)}
        pictures = [*entry.media.images, *(p for qid, ps in entry.media.question_images.items() if qid in valid
                                           for p in ps)]
        if not pictures:
            continue
        rejected = await decode(model, pictures)
        if rejected:
            entry.rejected = ApiError("invalid_request", next(iter(rejected.values())))


def check_any_valid(entries: list[Entry]) -> None:
    """A request with no valid question in any entry it answers is a 400 that lists every question's reason."""
    valid = [q for e in entries if e.rejected is None for q in e.questions if isinstance(q, Question)]
    if valid:
        return
    reasons = [f"{q.id if e.name is None else f'{e.name}.{q.id}'}: {q.message}" for e in entries
               if e.rejected is None for q in e.questions if isinstance(q, Invalid)]
    raise ApiError("invalid_request", "no question is valid: " + "; ".join(reasons))


def check_request_tokens(model: ServedModel, entry: Entry) -> None:
    """State-once models bound a whole request: the state once plus each question's own tokens."""
    spec, limit = model.card.decisions, model.card.limits.max_request_tokens
    if spec is None or spec.usage != "state_once" or limit is None or entry.state is None:
        return
    encoder = model.text_encoder()
    tokenizer = model.tokenizer
    assert tokenizer is not None
    state = encoder.encode(entry.state.view(None).text, max_tokens=limit + 1, overflow="truncate").tokens
    total = state
    for q in entry.questions:
        if isinstance(q, Question):
            texts = [q.instructions, *(o.description or o.key for o in q.options)]
            total += sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    if total > limit:
        entry.rejected = ApiError("invalid_request", f"the request holds at least {total} tokens (the state once "
                                                     f"plus each question), over model {model.id}'s "
                                                     f"max_request_tokens {limit}", reason="request_tokens",
                                  limit=limit)
