"""POST /v1/rerank — score documents against one query; results sorted by relevance (Cohere/Jina shape).

Two kinds of card (`rerank.kind`):
- bi-encoder: the query and every document are embedded (one Triton request each); logit = cosine of the two
  vectors, relevance_score = (1 + cosine) / 2, which keeps the order of cosine and lands in [0, 1].
- cross-encoder: one Triton request per (query, document) pair, framed by the tokenizer with token type ids; the
  model's one LOGITS value is the logit and relevance_score = sigmoid(logit).
Every document is its own Triton request, so the dynamic batcher mixes them with other traffic and a failing
document (empty, too long, deadline) fails alone; failed documents come last and are never cut by top_n.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import numpy as np
from aiohttp import web
from pydantic import Field, StrictBool, StrictInt, StrictStr

from ..cards import Card
from ..errors import ApiError, ErrorCode, ItemError, no_answer
from ..execution.jobs import Job, encode_each, run_jobs
from ..execution.limits import check_inputs, token_budget
from ..execution.meta import input_usage, response_meta
from ..execution.offload import off_loop_if_large
from ..execution.requests import Strict, TextOptions
from ..heads import ensure_finite, sigmoid
from ..runtime import Runtime, ServedModel
from ..text import Encoded, InputTooLong, TextEncoder, UnsupportedTokenizer
from ..timing import charge
from .common import Call, surface_route


class RerankRequest(Strict):
    model: StrictStr | None = None
    query: StrictStr = Field(min_length=1)
    documents: list[StrictStr] = Field(min_length=1)
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    options: TextOptions = TextOptions()


def _content(enc: Encoded) -> list[int]:
    """The ids of the text itself, without the special-token frame."""
    return [i for i, s in zip(enc.ids, enc.sequence_ids, strict=True) if s is not None]


def _content_offsets(enc: Encoded) -> list[tuple[int, int]]:
    return [o for o, s in zip(enc.offsets, enc.sequence_ids, strict=True) if s is not None]


def _budget(req: RerankRequest, model: ServedModel) -> int:
    """Request-level checks against the card; returns the token budget (special tokens included)."""
    check_inputs(model, len(req.documents), "documents")
    return token_budget(model, req.options.max_tokens)


# -- bi-encoder ---------------------------------------------------------------------------------------------------
def _bi_jobs(req: RerankRequest, encoder: TextEncoder, budget: int, card: Card,
             ) -> tuple[Job, Encoded, list[Job], list[Encoded | None]]:
    """The query's job and one job per document; an over-long query fails the whole request (nothing to rank).
    An instructed embedder reads each with its card's prefix (E5: "query: " and "passage: ")."""
    overflow = req.options.overflow
    spec, kinds = card.embedding, card.rerank
    query_text, documents = req.query, list(req.documents)
    if spec is not None and kinds is not None:
        query_text = spec.prefixed(query_text, kinds.query_input_type)
        documents = [spec.prefixed(doc, kinds.document_input_type) for doc in documents]
    try:
        query = encoder.encode(query_text, max_tokens=budget, overflow=overflow)
    except InputTooLong as exc:
        raise ApiError("invalid_request", f"query: {exc.message}") from exc
    jobs, encoded = encode_each(documents, lambda doc: encoder.encode(doc, max_tokens=budget,
                                                                             overflow=overflow), noun="document")
    return Job(query.ids), query, jobs, encoded


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    cos = float(a @ b) / max(norm, 1e-12)
    ensure_finite(cos)
    return min(1.0, max(-1.0, cos))


def _score(job: Job, query_job: Job | None, query_error: ItemError | None) -> tuple[float, float]:
    """(logit, relevance score) of one document: the cosine to the query's vector, mapped to [0, 1] (bi-encoder),
    or the sigmoid of the pair's one logit (cross-encoder); an ItemError fails this document only."""
    if job.error is not None:
        raise job.error
    if query_error is not None:
        raise query_error
    if job.result is None:
        raise no_answer()
    values = job.result.values
    if query_job is not None:
        assert query_job.result is not None
        cos = _cosine(query_job.result.values, values)
        return cos, (1.0 + cos) / 2.0
    if values.size != 1:
        raise ItemError("invalid_model_output", f"the model gave {values.size} values for a pair, not 1")
    logit = float(values.reshape(-1)[0])
    ensure_finite(logit)
    return logit, float(sigmoid(logit))


# -- cross-encoder ------------------------------------------------------------------------------------------------
def _pair(encoder: TextEncoder, query: str, whole_query: Encoded | None, doc: str, budget: int,
          overflow: Literal["reject", "truncate"]) -> Encoded:
    """One (query, document) pair within the budget; truncation keeps the query whole when it can.

    `encode_pair` cuts the longer side first, which keeps a query within half the room whole; a longer query that
    still fits with room to spare (`whole_query`) is kept whole here by cutting only the document.
    """
    pair = encoder.encode_pair(query, doc, max_tokens=budget, overflow=overflow)
    layout = encoder.pair_layout
    if not pair.truncated or whole_query is None or layout is None:
        return pair
    query_ids = _content(whole_query)
    if sum(1 for s in pair.sequence_ids if s == 0) == len(query_ids):
        return pair  # the query is already whole
    single = sum(len(group) for group in encoder.envelope)
    room = budget - layout.size - len(query_ids)  # document tokens left beside the whole query
    doc_part = encoder.encode(doc, max_tokens=room + single, overflow="truncate")
    ids, type_ids, sequence_ids = layout.frame([query_ids, _content(doc_part)])
    offsets = ([(0, 0)] * len(layout.prefix) + _content_offsets(whole_query) + [(0, 0)] * len(layout.middle)
               + _content_offsets(doc_part) + [(0, 0)] * len(layout.suffix))
    return Encoded(ids, offsets, type_ids, sequence_ids, pair.tokens, True, pair.tokens_lower_bound)


def _cross_jobs(req: RerankRequest, encoder: TextEncoder, budget: int) -> tuple[list[Job], list[Encoded | None]]:
    """One job per pair; a query that leaves no room for any document fails the request under reject."""
    layout = encoder.pair_layout
    if layout is None:
        raise ApiError("internal_error", "this model's tokenizer does not frame text pairs")
    overflow = req.options.overflow
    try:
        query: Encoded | None = encoder.encode(req.query, max_tokens=budget, overflow="truncate")
    except InputTooLong:  # a budget smaller than the frame
        query = None
    whole = query is not None and not query.truncated and len(_content(query)) + layout.size < budget
    if not whole and overflow == "reject":
        taken = f"takes {len(_content(query)) + layout.size}" if query is not None and not query.truncated \
            else "does not fit"
        raise ApiError("invalid_request", f"query: with a pair's special tokens it {taken} of max_length {budget} "
                                          "tokens, which leaves no room for a document")
    try:
        return encode_each(req.documents, lambda doc: _pair(encoder, req.query, query if whole else None, doc,
                                                            budget, overflow), noun="document", pairs=True)
    except UnsupportedTokenizer as exc:
        raise ApiError("internal_error", f"this model's tokenizer cannot frame pairs: {exc}") from exc


# -- the surface --------------------------------------------------------------------------------------------------
async def rerank(runtime: Runtime, model: ServedModel, req: RerankRequest, call: Call | None = None,
                 ) -> dict[str, Any]:
    """The surface's work, apart from HTTP, so a bundle or readiness check can call it too."""
    timing = call.timing if call is not None else None
    started = time.perf_counter()
    spec = model.card.rerank
    assert spec is not None, "cards that serve rerank have a rerank section"
    budget = _budget(req, model)
    encoder = model.text_encoder()
    query_job: Job | None = None
    query_enc: Encoded | None = None
    ran_query = False
    chars = len(req.query) + sum(map(len, req.documents))
    if spec.kind == "bi-encoder":
        bi = await off_loop_if_large(chars, _bi_jobs, req, encoder, budget, model.card)
        query_job, query_enc, jobs, encoded = bi
        runnable = [j for j in jobs if j.error is None]
        ran_query = bool(runnable)  # with no document to score, the query need not run
        everything = [query_job, *jobs] if ran_query else jobs
    else:
        jobs, encoded = await off_loop_if_large(chars, _cross_jobs, req, encoder, budget)
        everything = jobs
    charge(timing, "tokenize", started)
    queue_ms, forward_ms = await run_jobs(runtime, model, everything, deadline_ms=req.options.deadline_ms,
                                         timing=timing)
    mark = time.perf_counter()

    input_tokens = 0
    query_error: ItemError | None = None
    if ran_query and query_job is not None and query_enc is not None:
        if query_job.result is None:
            why = no_answer(query_job.error)
            query_error = ItemError(why.code, f"the query failed: {why.message}")
        else:
            input_tokens += query_enc.tokens
    ranked: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for index, (job, enc) in enumerate(zip(jobs, encoded, strict=True)):
        try:
            logit, score = _score(job, query_job, query_error)
            if enc is None:
                raise no_answer()
        except ItemError as error:  # fails this document only
            failed.append({"index": index, "error": error.code, "message": error.message})
            runtime.metrics.count_input(model.id, error.code)
            continue
        entry: dict[str, Any] = {"index": index, "relevance_score": score, "logit": logit}
        if req.return_documents:
            entry["document"] = {"text": req.documents[index]}
        entry["input"] = input_usage(enc)
        input_tokens += enc.tokens
        runtime.metrics.count_input(model.id, "ok")
        ranked.append(entry)
    # Highest score first; equal scores by logit (sigmoid saturates) and then in request order.
    ranked.sort(key=lambda e: (-e["relevance_score"], -e["logit"], e["index"]))
    if req.top_n is not None:
        ranked = ranked[: req.top_n]
    response: dict[str, Any] = {"model": model.id, "results": ranked + failed,
                                "usage": {"input_tokens": input_tokens, "output_tokens": 0}}
    if req.options.return_meta:
        response["meta"] = response_meta(model, queue_ms, forward_ms)
    charge(timing, "post", mark)
    return response


# -- Cohere's v2 shape ----------------------------------------------------------------------------------------------
class CohereV2Request(Strict):
    """`POST /v2/rerank` as Cohere's ClientV2 sends it. Cohere truncates long documents rather than rejecting them,
    so documents are read up to `max_tokens_per_doc` (default: the model's limit) with overflow truncate."""

    model: StrictStr
    query: StrictStr = Field(min_length=1)
    documents: list[StrictStr] = Field(min_length=1)
    top_n: StrictInt | None = Field(default=None, ge=1)
    max_tokens_per_doc: StrictInt | None = Field(default=None, ge=1)
    priority: StrictInt | None = None  # accepted for compatibility; this server has one priority class


async def rerank_v2(runtime: Runtime, model: ServedModel, req: CohereV2Request, call: Call | None = None,
                    ) -> dict[str, Any]:
    limit = model.card.limits.max_input_tokens
    inner = RerankRequest(model=req.model, query=req.query, documents=req.documents, top_n=req.top_n,
                          options=TextOptions(overflow="truncate", max_tokens=min(req.max_tokens_per_doc or limit,
                                                                                   limit)))
    answer = await rerank(runtime, model, inner, call)
    failed = [r for r in answer["results"] if "error" in r]
    if failed:  # Cohere's shape has no per-document errors: the first failure fails the request
        first = failed[0]
        code: ErrorCode = "invalid_request" if first["error"] in ("invalid_input", "max_length_exceeded") else (
            "not_ready" if first["error"] == "unavailable" else "internal_error")
        raise ApiError(code, f"document {first['index']}: {first['error']}: {first['message']}")
    return {"id": uuid.uuid4().hex,
            "results": [{"index": r["index"], "relevance_score": r["relevance_score"]} for r in answer["results"]],
            "meta": {"api_version": {"version": "2"},
                     "billed_units": {"search_units": 1},
                     "tokens": {"input_tokens": answer["usage"]["input_tokens"], "output_tokens": 0}}}


def routes() -> list[web.RouteDef]:
    return [surface_route("/v1/rerank", "rerank", RerankRequest, rerank),
            surface_route("/v2/rerank", "rerank", CohereV2Request, rerank_v2)]
