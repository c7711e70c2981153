"""Schemathesis hooks for tests/gateway/test_schemathesis.py (loaded by `st` through SCHEMATHESIS_HOOKS).

The request-side checks (positive_data_acceptance, negative_data_rejection) hold over every operation, except for
the rules listed here, each named with why the OpenAPI 3.0 document cannot state it. A failure is dropped only when
the server's own answer shows it is that rule: an in-place rejection, or a 400/422 whose message is the rule's
message. Every other failure of those checks fails the test. Schemathesis prints how many it dropped.
"""

from __future__ import annotations

import ast
import os
import re
import threading
from typing import Any

import schemathesis
from schemathesis.core.failures import AcceptedNegativeData, ServerError
from schemathesis.openapi.checks import RejectedPositiveData

# CPython 3.11 before 3.11.8 tracks the AST constructor's recursion depth in global state, so two threads parsing at
# once fail with "SystemError: AST constructor recursion depth mismatch" (gh-106905). Hypothesis parses lambda
# sources while describing strategies, and `--workers 2` runs two threads: parse one at a time.
_PARSE = ast.parse
_PARSING = threading.Lock()


def _parse_alone(*args: Any, **kwargs: Any) -> Any:
    with _PARSING:
        return _PARSE(*args, **kwargs)


ast.parse = _parse_alone  # type: ignore[assignment]

# Rules a schema-valid request can still break, by the server's message. Each is a cross-field or cross-item rule
# (JSON Schema has no way to relate two values), a name rule (OpenAPI 3.0 is JSON Schema draft 4: no
# propertyNames, so object keys cannot be constrained), or a fact of the named model's card (/v1/models: one
# document serves every model, and a value valid for one card is not for another).
POSITIVE_RULES: dict[str, str] = {
    # cross-item / cross-field
    r"task id .* is used twice": "bundle task ids are distinct (uniqueness of a member across array items)",
    r"the first part of a multipart body must be `request`":
        "the multipart part `request` comes first (OpenAPI describes parts as object members, which have no order)",
    r"is not referenced by any asset|names part .* which the body does not have|asset .* is never used|"
    r"is referenced by (both asset|task|request)":
        "every asset is used and every multipart part belongs to exactly one asset, of one task or batch request "
        "(references between request values)",
    r"roles names parts|roles names parts of an object state":
        "roles name parts of an object state (keys of one value must be keys of another)",
    r"over names|a span question reads one part|over must name exactly one":
        "a question's `over` names parts of the state",
    r"box question needs an image|box_needs_image|a box question locates in one|reference the one to search":
        "a box question needs exactly one image in its question or the state",
    r"names? '.*' twice": "keys of a list form (choices, labels) are distinct (a member unique across items)",
    r"options\.window needs overflow window|overlap must be below":
        "classify windows: with overflow left out, a window needs a head whose default is window, and the overlap "
        "must be below the window's content tokens (the tokenizer's special tokens): the card's",
    r"^query: .*exceeds its max_length":
        "a query over the token budget fails the request (nothing to rank): token counts are the text's, not shape",
    # names
    r"blank question id|blank state name|part names must not be blank|keys must not be blank|"
    r"asset reference .* bytes; a reference is 1 to":
        "ids, state, part and option names are not blank, asset references 1-1,024 bytes (OpenAPI 3.0 cannot "
        "constrain object keys)",
    # card facts
    r"special tokens every input needs":
        "a token budget holds at least the tokenizer's special tokens: the served document's max_tokens minimum is "
        "the fewest any served model of the surface needs; a model (or a pair's frame) that needs more is its card's",
    r"exceeds model .*'s (max_input_tokens|max_scan_tokens)": "token budgets are capped by the card's limits",
    r"has no head|takes \[.*\] inputs, not":
        "the served document enumerates every served classify head; which model has which head, and the inputs "
        "each head takes, are the card's",
    r"dimensions must be one of|layer must be one of|takes no input_type|input_type must be one of":
        "embedding dimensions, layers and input types are the card's",
    r"takes at most \d+ per request": "the most inputs per request is the card's limits.max_inputs",
    r"does not read (images|videos)|does not answer|has no preset|is a .* question, not":
        "modalities, question types and presets are the card's",
    r"names no entity type the tagger finds":
        "span labels of a tagger-backed decisions family are the tagger's entity types (card)",
    r"must be a base64 data URL|not a PNG, JPEG or WebP image|GIF images|the image is empty|the image has|"
    r"header cannot be read|aspect ratio|animated|truncated or corrupt":
        "images are PNG, JPEG or WebP bytes within the size limits (content, not shape)",
    r"videos\[\d+\](: | is not valid base64)":
        "videos are MP4/QuickTime, WebM/Matroska or AVI bytes within the size and length limits (content, not shape)",
}


def _message(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message", ""))
    detail = body.get("detail")
    if isinstance(detail, list):
        return "; ".join(str(d.get("msg", "")) for d in detail if isinstance(d, dict))
    return str(detail or "")


def _in_place_rejection(path: str, body: Any) -> bool:
    """Whether a 200 answer rejected part of the request in place, as the spec has it: a bundle task or a System
    One batch request with its own 4xx, or a decisions question answered with its own error."""
    if not isinstance(body, dict):
        return False
    if path == "/v1/bundle":
        return any(r.get("status", 200) >= 400 or (isinstance(r.get("decisions"), dict)
                                                    and _in_place_rejection("/v1/decisions", r["decisions"]))
                   for r in body.get("results", []))
    if path == "/v1/systemone/batch":
        return any(r.get("status", 200) >= 400 for r in body.get("responses", {}).values())
    if path == "/v1/decisions":
        answers = [*body.get("answers", {}).values(),
                   *(a for s in body.get("states", {}).values() for a in s.get("answers", {}).values())]
        return any("error" in a for a in answers)
    return False


def _blank(keys: Any) -> bool:
    return isinstance(keys, dict) and any(not k.strip() for k in keys)


def _blank_names(request: Any) -> bool:
    """Whether a decisions request names a question, state, state part or criteria key with a blank string."""
    if not isinstance(request, dict):
        return False
    entries = [request, *(request["states"].values() if isinstance(request.get("states"), dict) else ())]
    return _blank(request.get("states")) or any(
        _blank(e.get("state")) or _blank(e.get("questions")) or (isinstance(e.get("questions"), dict) and any(
            isinstance(q, dict) and _blank(q.get("criteria")) for q in e["questions"].values()))
        for e in entries if isinstance(e, dict))


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """Positive cases name no question, state, part or option with a blank string: the server refuses such names
    and OpenAPI 3.0 (JSON Schema draft 4, no propertyNames) cannot say so, so without this most positive decisions
    cases would test that one rule. Negative cases are left as drawn."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return True
    body, path = case.body, case.operation.path
    if path in ("/v1/decisions", "/v1/systemone"):
        return not _blank_names(body)
    if path == "/v1/systemone/batch" and isinstance(body.get("requests"), dict):
        return not any(_blank_names(r) for r in body["requests"].values())
    if path == "/v1/bundle" and isinstance(body.get("tasks"), list):
        return not any(_blank_names(t.get("decisions")) for t in body["tasks"] if isinstance(t, dict))
    return True


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure except those the rules above name (see the module docstring)."""
    path = case.operation.path
    try:
        body = response.json()
    except Exception:
        return True
    if isinstance(failure, AcceptedNegativeData) and response.status_code == 200 and _in_place_rejection(path, body):
        return _dropped(path, "rejected in place")
    if (isinstance(failure, ServerError) and response.status_code == 504 and isinstance(body, dict)
            and body.get("question_error") == "deadline_exceeded"):
        # a deadline that passed is runtime state, not the document's: System One answers it 504 (spec)
        return _dropped(path, "deadline passed (System One 504)")
    if isinstance(failure, RejectedPositiveData) and response.status_code in (400, 422):
        message = _message(body)
        if body.get("question_error") in ("max_length_exceeded", "scan_budget_exceeded"):
            # System One fails the request 400 for an input over its token budget (spec): the text's length
            return _dropped(path, "an input over its token budget (System One 400; token counts are content)")
        rule = next((r for r in POSITIVE_RULES if re.search(r, message)), None)
        if rule is not None:
            return _dropped(path, POSITIVE_RULES[rule])
    return True


def _dropped(path: str, why: str) -> bool:
    """Count a dropped failure by operation and rule (SR_SCHEMATHESIS_DROPPED names the file) for the report."""
    report = os.environ.get("SR_SCHEMATHESIS_DROPPED")
    if report:
        with open(report, "a", encoding="utf-8") as out:
            out.write(f"{path}\t{why}\n")
    return False
