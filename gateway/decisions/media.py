"""Images in decisions: assets substituted into an entry's state and questions, numbered, placed and decoded.

Every image use is read as one more image: the entry's `images` first, then each use in the state (in reading
order), all in front of the state, whose text refers to each as `[image k]`. An image in a question's instructions
or options belongs to that question only (numbered after the entry's images) and is allowed only where the card's
`image_placements` lists that place; elsewhere the question fails with `question_images_unsupported` (it is never
moved into the state: that would change every other question's answer). A model without the image modality
refuses images; an image the decoder rejects fails the entry (or the request) naming its asset.

Videos (`videos`: data URLs, gateway/videos) are checked and the frames the entry's questions read are sampled
while the request is planned, so a malformed container fails its entry like a rejected image. `box` questions with
`at` and `track` questions locate their target in the entry's only video at sampled moments: each frame is read as
its OCR text lines and the line most like the instructions is the target; a video longer than the card's
`box_video_max_seconds` fails them alone (`box_video_too_long`). Every other question reads each video as
"[video k]" and the text lines of `moments.OVERVIEW_FRAMES` frames spread over it, in front of the state (after the
images); a video longer than `video_max_seconds` fails their entry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..assets import Asset, Assets, ImageUse, Segments
from ..errors import ApiError, ItemError, QuestionCode
from ..execution.jobs import Job, run_jobs
from ..images.decode import DecodedImage, ImageRejected, decode_async
from ..images.ocr import TextLine, read_many
from ..runtime import ServedModel
from ..timing import Timing
from ..videos import moments
from ..videos.clips import ClipRejected, parse_clip, raw_key
from ..videos.container import Probe, VideoRejected, probe_async, sample_async
from ..videos.tracking import spot
from .answers import Outcome
from .families.base import Ask, Context, Family, Phases
from .questions import Invalid, Question, QuestionError

DATA_URL = re.compile(r"^data:image/([A-Za-z0-9.+-]+);base64,(.*)$", re.DOTALL)  # the bytes say the format
QUESTION_PLACES = {"instructions": "instructions"}  # every other member of a question holds its options: criteria


@dataclass
class Picture:
    """One image use an entry or a question reads."""

    asset: Asset
    number: int  # k in "[image k]"
    decoded: DecodedImage | None = None

    @property
    def key(self) -> str:
        return hashlib.sha256(self.asset.data).hexdigest()


@dataclass
class EntryMedia:
    state: Any  # the state with every image replaced by "[image k]"
    questions: dict[str, Any]
    images: list[Picture] = field(default_factory=list)  # read in front of the state, in order
    question_images: dict[str, list[Picture]] = field(default_factory=dict)
    question_places: dict[str, set[str]] = field(default_factory=dict)  # where each question holds images
    videos: list[Any] = field(default_factory=list)  # as sent (data URLs)
    read: list[VideoRead] = field(default_factory=list)  # each video, checked and sampled, in order


@dataclass
class VideoRead:
    """One video of an entry as its questions read it: what the container says and the frames sampled."""

    key: str  # clips.raw_key of the entry as sent (in each question's `extra["video"]` / `extra["videos"]`)
    probe: Probe
    frames: dict[float, DecodedImage]
    overview: list[float]  # the moments other questions read (empty when no other question reads the entry)


def _data_url(index: int, value: Any, where: str) -> Asset:
    if not isinstance(value, str):
        raise ApiError("invalid_request", f"{where}[{index}] must be a data URL or an asset reference")
    match = DATA_URL.match(value)
    if match is None:
        raise ApiError("invalid_request", f"{where}[{index}] must be a base64 data URL (data:image/png|jpeg|webp;"
                                          "base64,...) or an asset reference; remote URLs are not fetched")
    try:
        data = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError("invalid_request", f"{where}[{index}] is not valid base64: {exc}") from exc
    return Asset(f"{where}[{index}]", data)


class Numbering:
    """Replaces image uses by "[image k]" and records the pictures, in reading order."""

    def __init__(self, start: int = 1) -> None:
        self.next = start
        self.pictures: list[Picture] = []

    def add(self, asset: Asset) -> str:
        self.pictures.append(Picture(asset, self.next))
        self.next += 1
        return f"[image {self.pictures[-1].number}]"

    def text(self, value: Any) -> Any:
        if isinstance(value, ImageUse):
            return self.add(value.asset)
        if isinstance(value, Segments):
            return "".join(self.add(p.asset) if isinstance(p, ImageUse) else p for p in value)
        if isinstance(value, list):
            return [self.text(v) for v in value]
        if isinstance(value, dict):
            return {k: self.text(v) for k, v in value.items()}
        return value


def _uses(value: Any) -> bool:
    if isinstance(value, ImageUse | Segments):
        return True
    if isinstance(value, list):
        return any(_uses(v) for v in value)
    if isinstance(value, dict):
        return any(_uses(v) for v in value.values())
    return False


def leading_images(state: Any) -> tuple[list[ImageUse], Any]:
    """System One's array state: images (then videos) whose placeholders stand before exactly one other element
    are read in front of that element, which is then the state."""
    if not isinstance(state, list) or isinstance(state, Segments) or len(state) < 2:
        return [], state
    images = [v for v in state[:-1] if isinstance(v, ImageUse)]
    if len(images) != len(state) - 1 or isinstance(state[-1], ImageUse):
        return [], state
    return images, state[-1]


def substitute(assets: Assets, state: Any, questions: Any, images: Any, where: str, *,
               leading: bool = False) -> EntryMedia:
    """One entry's state and questions with their images numbered ("[image k]") and collected."""
    numbering = Numbering()
    listed = images if images is not None else []
    if not isinstance(listed, list):
        raise ApiError("invalid_request", f"{where}images must be a list")
    used = assets.substitute(listed)
    for index, item in enumerate(used):
        if isinstance(item, ImageUse):
            numbering.add(item.asset)
        else:
            numbering.add(_data_url(index, item, f"{where}images"))
    raw_state = assets.substitute(state)
    if leading:
        ahead, raw_state = leading_images(raw_state)
        for use in ahead:
            numbering.add(use.asset)
    text_state = numbering.text(raw_state)
    media = EntryMedia(text_state, {}, list(numbering.pictures))
    if not isinstance(questions, dict):
        media.questions = questions  # entries.py answers a malformed `questions` with its own 400
        return media
    for qid, raw in questions.items():
        sub = assets.substitute(raw)
        local = Numbering(numbering.next)
        if isinstance(sub, dict):
            places = {QUESTION_PLACES.get(k, "criteria") for k, v in sub.items() if _uses(v)}
            media.questions[qid] = local.text(sub)
        else:
            places = set()
            media.questions[qid] = sub
        if local.pictures:
            media.question_images[qid] = local.pictures
            media.question_places[qid] = places
    return media


async def decode(model: ServedModel, pictures: list[Picture]) -> dict[str, str]:
    """Decode every picture once per distinct upload at the card's size; returns {key: rejection message}."""
    max_pixels = model.card.image_max_pixels or 1_638_400
    done: dict[str, DecodedImage | str] = {}
    for picture in pictures:
        if picture.key not in done:
            try:
                done[picture.key] = await decode_async(picture.asset.data, max_pixels)
            except ImageRejected as exc:
                done[picture.key] = f"asset {picture.asset.ref!r}: {exc}"
        found = done[picture.key]
        if isinstance(found, DecodedImage):
            picture.decoded = found
    return {k: v for k, v in done.items() if isinstance(v, str)}


# -- videos ------------------------------------------------------------------------------------------------------
def reads_video(q: Question) -> bool:
    """`track`, and `box` with `at`, locate in the state's video; every other question leaves it to the family."""
    return q.type == "track" or (q.type == "box" and "at" in q.extra)


@dataclass(frozen=True)
class Locator:
    """What a family needs to read videos: an OCR model to read frames, a text embedder to compare (its own)."""

    ocr: str
    temperature: float
    visible_bias: float
    visible_temperature: float


def locator(fam: Family) -> Locator | None:
    """The family's way to read frames (zeroshot: its OCR model and box temperature); None: it has none."""
    params = getattr(fam, "params", None)
    ocr = getattr(params, "ocr", None)
    temperature = getattr(params, "temperature", None)
    if ocr is None or not isinstance(temperature, dict):
        return None
    bias = getattr(params, "bias", {}) or {}
    return Locator(ocr.model, temperature.get("box", 0.05), bias.get("visible", 0.3),
                   temperature.get("visible", 0.05))


def video_question(model: ServedModel, fam: Family, q: Question, media: EntryMedia) -> Question:
    """Check a locating question against the model and the entry; returns it keyed to its video (the result cache
    must tell two videos apart). Raises QuestionError with the spec's code."""
    code: QuestionCode = "track_unsupported" if q.type == "track" else "box_unsupported"
    what = "track questions" if q.type == "track" else "box questions with `at`"
    if "video" not in model.card.modalities:
        raise QuestionError(f"{what} locate in a video; model {model.id} reads no videos", code)
    if locator(fam) is None:
        raise QuestionError(f"model {model.id} lists {q.type} questions, but its family "
                            f"({model.card.decisions.family if model.card.decisions else '?'}) cannot locate in "
                            "videos", code)
    if not media.videos:
        raise QuestionError(f"{what} need a video in the state (videos)", "box_needs_image")
    if len(media.videos) > 1:
        raise QuestionError(f"the state holds {len(media.videos)} videos; {what} locate in its only video",
                            "box_target_ambiguous")
    return replace(q, extra={**q.extra, "video": raw_key(media.videos[0])})


def _reject(entry: Any, message: str) -> None:
    entry.rejected = ApiError("invalid_request", message)


async def _probe(entry: Any, where: str, raws: list[Any]) -> list[tuple[Any, Probe]] | None:
    try:
        clips = [parse_clip(raw, f"{where}[{i}]") for i, raw in enumerate(raws)]
    except ClipRejected as exc:
        _reject(entry, str(exc))
        return None
    out = []
    for clip in clips:
        try:
            out.append((clip, await probe_async(clip.data)))
        except VideoRejected as exc:
            _reject(entry, f"{clip.ref}: {exc}")
            return None
    return out


def _locating_moments(model: ServedModel, entry: Any, seconds: float | None) -> set[float]:
    """The moments the entry's locating questions read; a question the video is too long for (or whose `at` is
    past its end) is replaced by its failure."""
    limits = model.card.limits
    box_limit = limits.box_video_max_seconds or limits.video_max_seconds
    wanted: set[float] = set()
    for index, q in enumerate(entry.questions):
        if not isinstance(q, Question) or not reads_video(q):
            continue
        if seconds is None or (box_limit is not None and seconds > box_limit):
            said = ("its container does not give the video's length" if seconds is None else
                    f"the video is {seconds:g} s long")
            bound = f"at most {box_limit:g} s" if box_limit is not None else "videos whose length is known"
            entry.questions[index] = Invalid(q.id, q.type, f"{said}; {q.type} questions read {bound} "
                                                           "(box_video_max_seconds)", "box_video_too_long")
        elif q.type == "box" and float(q.extra["at"]) > seconds:
            entry.questions[index] = Invalid(q.id, q.type, f"at {q.extra['at']:g} s is past the end of the video "
                                                           f"({seconds:g} s)")
        else:
            wanted.update(moments.times(q.type, q.extra, seconds))
    return wanted


async def read_videos(model: ServedModel, entries: list[Any]) -> None:
    """Check every entry's videos and sample the frames its questions read (entries.Entry objects). A malformed
    container, or one longer than `video_max_seconds` when other questions read the entry, fails the entry (a
    length the container does not give is not held against them: they read its first frame only); a
    locating question over `box_video_max_seconds`, or over a video whose length its container does not give,
    fails alone with `box_video_too_long`. One request samples at most MAX_REQUEST_FRAMES frames."""
    limit = model.card.limits.video_max_seconds
    budget = moments.MAX_REQUEST_FRAMES
    for entry in entries:
        media: EntryMedia | None = entry.media
        if entry.rejected is not None or media is None or not media.videos:
            continue
        where = "videos" if entry.name is None else f"states.{entry.name}.videos"
        probed = await _probe(entry, where, media.videos)
        if probed is None:
            continue
        others = [i for i, q in enumerate(entry.questions) if isinstance(q, Question) and not reads_video(q)]
        too_long = next(((c, p) for c, p in probed if others and limit is not None and p.seconds is not None
                         and p.seconds > limit), None)
        if too_long is not None:
            _reject(entry, f"{too_long[0].ref}: it is {too_long[1].seconds:g} s long; model {model.id} reads "
                           f"videos of at most {limit:g} s (video_max_seconds)")
            continue
        plans = []
        for index, (clip, found) in enumerate(probed):
            overview = moments.overview_times(found.seconds) if others else []
            located = _locating_moments(model, entry, found.seconds) if index == 0 else set()
            plans.append((clip, found, overview, located | set(overview)))
        needed = sum(len(wanted) for *_, wanted in plans)
        if needed > budget:
            _reject(entry, f"{where}: its questions read {needed} sampled frames; one request reads at most "
                           f"{moments.MAX_REQUEST_FRAMES}")
            continue
        budget -= needed
        read = []
        for (clip, found, overview, wanted), raw in zip(plans, media.videos, strict=True):
            try:
                frames = await sample_async(clip.data, sorted(wanted)) if wanted else {}
            except VideoRejected as exc:
                _reject(entry, f"{clip.ref}: {exc}")
                break
            read.append(VideoRead(raw_key(raw), found, frames, overview))
        if entry.rejected is not None:
            continue
        media.read = read
        keys = [r.key for r in read]
        for index in others:  # what they read depends on the videos: so does a cached answer
            q = entry.questions[index]
            entry.questions[index] = replace(q, extra={**q.extra, "videos": keys})


async def answer_with_videos(ctx: Context, fam: Family, asks: list[Ask], medias: list[EntryMedia]
                             ) -> list[Phases]:
    """Read the sampled frames once through the OCR model; put each video's text in front of the state of the
    questions that read it; let the family answer those and the rest; answer the locating questions here."""
    reads: dict[str, VideoRead] = {}
    for r in (r for m in medias for r in m.read):  # the same video in several entries: their frames together
        have = reads.get(r.key)
        reads[r.key] = r if have is None else VideoRead(r.key, r.probe, {**have.frames, **r.frames},
                                                          sorted({*have.overview, *r.overview}))
    located = [a for a in asks if reads_video(a.question)]
    watching = [a for a in asks if not reads_video(a.question) and a.question.extra.get("videos")]
    phases: list[Phases] = []
    lines_of: dict[int, list[TextLine] | ItemError] = {}
    found = locator(fam)
    if located or watching:
        ocr = ctx.runtime.models.get(found.ocr) if found is not None else None
        if found is None or ocr is None or not ocr.ready:
            why = ("this model's family reads no frames" if found is None else
                   f"it reads them through {found.ocr}, which is not {'served' if ocr is None else 'ready'}")
            for ask in [*located, *watching]:
                ask.fail(ItemError("unavailable", f"the question reads a video, but {why}"))
        else:
            wanted = {a.question.extra["video"] for a in located} | {k for a in watching
                                                                     for k in a.question.extra["videos"]}
            pictures = {id(img): img for k in wanted for img in reads[k].frames.values()}
            timing = Timing(started=ctx.started)
            answers = await read_many(ctx.runtime, ocr, list(pictures.values()), deadline_ms=ctx.deadline_ms,
                                      timing=timing)
            lines_of = dict(zip(pictures, answers, strict=True))
            phases.append(Phases.of(timing.ms["queue"], timing.ms["forward"]))
            for ask in watching:
                _watch(ask, [reads[k] for k in ask.question.extra["videos"]], lines_of)
    rest = [a for a in asks if not reads_video(a.question) and a.error is None]
    if rest:
        phases += await fam.answer(ctx, rest)
    live = [a for a in located if a.error is None]
    if live and found is not None:
        phases.append(await _locate(ctx, fam, live, reads, lines_of, found))
    return phases


def _watch(ask: Ask, videos: list[VideoRead], lines_of: dict[int, list[TextLine] | ItemError]) -> None:
    """Each video as `[video k]` and the distinct text lines of its overview frames, in front of the state."""
    blocks = []
    for number, video in enumerate(videos, start=1):
        seen: list[str] = []
        for moment in video.overview:
            lines = lines_of[id(video.frames[moment])]
            if isinstance(lines, ItemError):
                ask.fail(lines)
                return
            seen.extend(line.text for line in lines if line.text not in seen)
        blocks.append("\n".join([f"[video {number}]", *seen]))
    ask.view = replace(ask.view, text="\n\n".join([*blocks, ask.view.text]))


async def _locate(ctx: Context, fam: Family, asks: list[Ask], reads: dict[str, VideoRead],
                  lines_of: dict[int, list[TextLine] | ItemError], found: Locator) -> Phases:
    """The instructions and every line of the frames each question reads embedded once, then compared."""
    plans: list[tuple[Ask, list[tuple[float, DecodedImage]]]] = []
    for ask in asks:
        video = reads[ask.question.extra["video"]]
        times = moments.times(ask.question.type, ask.question.extra, video.probe.seconds or 0.0)
        plans.append((ask, [(t, video.frames[t]) for t in times]))
    encoder = fam.model.text_encoder()
    limit = fam.model.card.limits.max_input_tokens
    jobs: dict[str, Job] = {}
    for ask, frames in plans:
        texts = [ask.question.instructions]
        for _, img in frames:
            lines = lines_of[id(img)]
            if isinstance(lines, list):
                texts.extend(line.text for line in lines)
        for text in texts:
            if text not in jobs:
                jobs[text] = Job(encoder.encode(text, max_tokens=limit, overflow="truncate").ids)
        ask.question_tokens = len(jobs[ask.question.instructions].ids)
    timing = Timing(started=ctx.started)
    await run_jobs(ctx.runtime, fam.model, list(jobs.values()), deadline_ms=ctx.deadline_ms, timing=timing)
    for ask, frames in plans:
        _answer(ask, frames, lines_of, jobs, found)
    return Phases.of(timing.ms["queue"], timing.ms["forward"])


def _vector(job: Job) -> np.ndarray:
    assert job.result is not None
    return np.asarray(job.result.values, dtype=np.float64)


def _answer(ask: Ask, frames: list[tuple[float, DecodedImage]], lines_of: dict[int, list[TextLine] | ItemError],
            jobs: dict[str, Job], found: Locator) -> None:
    q = ask.question
    query = jobs[q.instructions]
    if query.result is None:
        ask.fail(query.error or ItemError("invalid_model_output", "the instructions were not embedded"))
        return
    track: list[dict[str, Any]] = []
    for time_s, img in frames:
        lines = lines_of[id(img)]
        if isinstance(lines, ItemError):
            ask.fail(lines)
            return
        failed = next((jobs[line.text] for line in lines if jobs[line.text].result is None), None)
        if failed is not None:
            ask.fail(failed.error or ItemError("invalid_model_output", "a text line was not embedded"))
            return
        cosines = np.asarray([float(_vector(query) @ _vector(jobs[line.text])) for line in lines])
        where = spot(lines, cosines, temperature=found.temperature, visible_bias=found.visible_bias,
                     visible_temperature=found.visible_temperature)
        if q.type == "box":
            conf = np.nan if where.confidence is None else where.confidence
            ask.outcome = Outcome(np.asarray([conf]), box=where.box, time=time_s)
            return
        track.append({"time": time_s, "box": where.box, "confidence": where.confidence, "visible": where.visible})
    ask.outcome = Outcome(np.asarray([1.0]), track=track)
