"""Readiness of a decisions model: its components are ready, its family warm, and a golden request reproduces the
answers recorded on its card (numbers within the card's tolerance, choices and selections exactly)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..runtime import Runtime, ServedModel
from .families import family
from .request import parse_request
from .response import render_decisions
from .running import answer as answer_request

COMPONENT_WAIT_SECONDS = 600.0


class GoldenMismatch(Exception):
    pass


async def prepare(runtime: Runtime, model: ServedModel) -> None:
    """Build the family (a card error fails the model here) and wait for the models it reads through."""
    fam = family(model)
    deadline = time.monotonic() + COMPONENT_WAIT_SECONDS
    for name in fam.components():
        while True:
            component = runtime.models.get(name)
            if component is None:
                raise GoldenMismatch(f"the decision family reads through {name}, which this process does not "
                                     f"serve (add it to --models)")
            if component.ready:
                break
            if component.status == "failed" or time.monotonic() > deadline:
                raise GoldenMismatch(f"component {name} is {component.status}: {component.reason}")
            await asyncio.sleep(0.1)
    for name in fam.optional_components():
        while (component := runtime.models.get(name)) is not None and not component.ready:
            if component.status == "failed" or time.monotonic() > deadline:
                break  # questions over images then fail alone, as unavailable
            await asyncio.sleep(0.1)
    await fam.warm(runtime)


async def answer(runtime: Runtime, model: ServedModel, request: dict[str, Any]) -> dict[str, Any]:
    req = parse_request({**request, "model": model.id})
    return render_decisions(await answer_request(runtime, model, req, None), req.options.return_meta)


def compare(got: dict[str, Any], expected: dict[str, Any], tolerance: float) -> int:
    """Checks every recorded answer; returns how many were checked."""
    answers = got.get("answers", {})
    checked = 0
    for qid, want in expected.get("answers", {}).items():
        have = answers.get(qid)
        if have is None or "error" in have:
            raise GoldenMismatch(f"question {qid} failed: {have}")
        _same(f"answers.{qid}", have, want, tolerance)
        checked += 1
    for section in ("spans", "sets"):
        for qid, want in expected.get(section, {}).items():
            _same(f"{section}.{qid}", got.get(section, {}).get(qid), want, tolerance)
            checked += 1
    return checked


def _same(where: str, have: Any, want: Any, tolerance: float) -> None:
    if isinstance(want, dict):
        if not isinstance(have, dict):
            raise GoldenMismatch(f"{where}: expected an object, got {have!r}")
        for key, value in want.items():
            _same(f"{where}.{key}", have.get(key), value, tolerance)
    elif isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            raise GoldenMismatch(f"{where}: expected {want!r}, got {have!r}")
        for i, (a, b) in enumerate(zip(have, want, strict=True)):
            _same(f"{where}[{i}]", a, b, tolerance)
    elif isinstance(want, float) and not isinstance(want, bool):
        if not isinstance(have, int | float) or abs(float(have) - want) > tolerance:
            raise GoldenMismatch(f"{where}: {have!r} differs from {want!r} by more than {tolerance:g}")
    elif have != want:
        raise GoldenMismatch(f"{where}: expected {want!r}, got {have!r}")
