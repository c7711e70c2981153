"""One mapping from a failed Triton call to the answer its input gets, for every kind of input."""

from __future__ import annotations

from ..errors import ItemError
from ..triton import TritonFailure


def failure_error(exc: TritonFailure, model_id: str, noun: str = "input") -> ItemError:
    """The item error of an input whose Triton call failed. Out of memory is not an item's fault alone: the caller
    (`run_jobs`) also turns it into the request's 413 or 429, so a picture and a text fail the same way."""
    if exc.deadline:
        return ItemError("deadline_exceeded", f"the deadline passed while this {noun} was queued")
    if exc.unavailable:
        return ItemError("unavailable", f"model {model_id} is unavailable: {exc}")
    return ItemError("invalid_model_output", f"the model failed on this {noun}: {exc}")
