"""Send the spec's decisions and bundle examples to a running gateway and check what comes back.

The spec (worker-http-api, 决策 and 打包) shows three `/v1/decisions` requests and one `/v1/bundle` request answered
by its reference model; this tool sends the same requests to the served decisions model and checks the documented
shapes plus the answers any competent model must give (`domain` is `code`, the e-mail at 71–91, `billing` and
`shipping` but not `account`, `doc_1` more relevant than `doc_2`). Exit status 0 when every check passes.

    python tools/reference_examples.py --url http://127.0.0.1:8080 [--model decision-zeroshot]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_MODEL = "decision-zeroshot"
DOMAIN_MODEL = "domain-zeroshot"
SCORE_TOLERANCE = 0.02  # the spec rounds its numbers to two decimals; Σ i·pᵢ of rounded pᵢ drifts by < 0.02
PROBABILITY_SUM_TOLERANCE = 0.02

ROUTING_STATE = "Write a Python function that merges two sorted lists and explain its running time."
SUPPORT_STATE = "My card was charged twice and the parcel never arrived. Write to me at jane.doe@example.com."
RELEVANCE = "Does the candidate passage contain information that helps answer the request?"
REFUND_REQUEST = "How long is the refund window?"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.name}: {self.detail}"


@dataclass(frozen=True)
class Reply:
    """What one POST answered: status, JSON body (None if not JSON) and headers."""

    status: int
    body: Any
    headers: Mapping[str, str]


def routing_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "state": ROUTING_STATE,
        "questions": {
            "domain": {
                "type": "choice",
                "instructions": "Which domain does this request belong to?",
                "choices": [
                    {"key": "code", "description": "Programming"},
                    {"key": "math", "description": "Mathematics"},
                    {"key": "other"},
                ],
            },
            "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
            "difficulty": {
                "type": "score",
                "instructions": "How difficult is this request?",
                "levels": ["Trivial", "Moderate", "Hard"],
            },
        },
    }


def support_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "state": SUPPORT_STATE,
        "questions": {
            "problems": {
                "type": "set",
                "instructions": "Which problems does the customer report?",
                "labels": [
                    {"key": "billing", "description": "A payment or charge problem"},
                    {"key": "shipping", "description": "A delivery problem"},
                    {"key": "account", "description": "A login or account problem"},
                ],
            },
            "contacts": {
                "type": "span",
                "instructions": "Find the personal contact details.",
                "labels": [{"key": "EMAIL_ADDRESS", "description": "An email address"}],
            },
        },
    }


def relevance_request(model: str) -> dict[str, Any]:
    question = {"relevance": {"type": "noul", "instructions": RELEVANCE}}
    return {
        "model": model,
        "states": {
            "doc_1": {
                "state": {"request": REFUND_REQUEST, "candidate": "Refunds are accepted within 30 days of purchase."},
                "questions": question,
            },
            "doc_2": {
                "state": {"request": REFUND_REQUEST, "candidate": "Our offices close on public holidays."},
                "questions": question,
            },
        },
    }


def bundle_request(model: str, domain_model: str = DOMAIN_MODEL) -> dict[str, Any]:
    return {
        "tasks": [
            {"id": "domain", "classify": {"model": domain_model, "input": ["What is 2 + 2?"]}},
            {"id": "kind", "decisions": {"model": model, "state": "What is 2 + 2?",
                                         "questions": {"math": {"type": "noul",
                                                                "instructions": "Is this a math question?"}}}},
        ],
        "options": {"deadline_ms": 80},
    }


def _requests(model: str, domain_model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "routing": ("/v1/decisions", routing_request(model)),
        "support": ("/v1/decisions", support_request(model)),
        "relevance": ("/v1/decisions", relevance_request(model)),
        "bundle": ("/v1/bundle", bundle_request(model, domain_model)),
    }


class _Checks:
    """Collects checks; `expect` records one and returns whether it passed so callers can skip dependent checks."""

    def __init__(self) -> None:
        self.items: list[Check] = []

    def expect(self, name: str, ok: bool, detail: str) -> bool:
        self.items.append(Check(name, bool(ok), detail))
        return bool(ok)

    def guarded(self, name: str, test: Callable[[], tuple[bool, str]]) -> bool:
        """A check whose evaluation may meet a malformed body: a KeyError or TypeError is a FAIL, not a crash."""
        try:
            ok, detail = test()
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            ok, detail = False, f"malformed response ({type(e).__name__}: {e})"
        return self.expect(name, ok, detail)


def _is_probability(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and 0.0 <= x <= 1.0


def _sums_to_one(probabilities: Mapping[str, Any]) -> bool:
    values = list(probabilities.values())
    return all(_is_probability(p) for p in values) and abs(sum(values) - 1.0) <= PROBABILITY_SUM_TOLERANCE


def _usage_ok(usage: Any) -> tuple[bool, str]:
    ok = (isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int) and usage["input_tokens"] > 0
          and usage.get("output_tokens") == 0)
    return ok, f"usage={usage}"


def _answered(c: _Checks, name: str, reply: Reply | None) -> bool:
    if reply is None:
        return c.expect(f"{name}: answered 200 with JSON", False, "no reply (connection failed)")
    ok = reply.status == 200 and isinstance(reply.body, dict)
    detail = f"status {reply.status}" + ("" if ok else f", body {str(reply.body)[:300]}")
    if not c.expect(f"{name}: answered 200 with JSON", ok, detail):
        return False
    timing = reply.headers.get("server-timing", "")
    c.expect(f"{name}: Server-Timing has total", "total" in timing, f"Server-Timing={timing!r}")
    return True


def _answer_ok(c: _Checks, where: str, answer: Any, kind: str) -> bool:
    return c.guarded(f"{where} is a {kind} answer without error",
                     lambda: (answer.get("type") == kind and "error" not in answer, f"{answer}"))


def check_routing(reply: Reply | None, model: str) -> list[Check]:
    c = _Checks()
    if not _answered(c, "routing", reply):
        return c.items
    assert reply is not None
    body = reply.body
    c.expect("routing: model is the served name", body.get("model") == model, f"model={body.get('model')!r}")
    answers = body.get("answers") or {}
    order = list(answers)
    if not c.expect("routing: answers in question order", order == ["domain", "reasoning", "difficulty"],
                    f"keys={order}"):
        return c.items
    domain, reasoning, difficulty = answers["domain"], answers["reasoning"], answers["difficulty"]
    if _answer_ok(c, "routing: domain", domain, "choice"):
        c.guarded("routing: domain probabilities keyed by option and summing to 1", lambda: (
            list(domain["probabilities"]) == ["code", "math", "other"] and _sums_to_one(domain["probabilities"]),
            f"probabilities={domain['probabilities']}"))
        c.guarded("routing: domain choice is the most probable option and confidence in [0, 1]", lambda: (
            domain["choice"] == max(domain["probabilities"], key=domain["probabilities"].get)
            and _is_probability(domain["confidence"])
            and ("abstain_probability" not in domain or _is_probability(domain["abstain_probability"])),
            f"choice={domain['choice']!r}, confidence={domain.get('confidence')}"))
        c.guarded("routing: domain answers code", lambda: (domain["choice"] == "code",
                                                           f"choice={domain['choice']!r}"))
    if _answer_ok(c, "routing: reasoning", reasoning, "noul"):
        c.guarded("routing: reasoning noul in [0, 1]", lambda: (_is_probability(reasoning["noul"]),
                                                                f"noul={reasoning['noul']}"))
    if _answer_ok(c, "routing: difficulty", difficulty, "score"):
        c.guarded("routing: difficulty legend names the levels by index", lambda: (
            difficulty["legend"] == {"0": "Trivial", "1": "Moderate", "2": "Hard"},
            f"legend={difficulty['legend']}"))

        def expected_level() -> tuple[bool, str]:
            p = difficulty["probabilities"]
            mean = sum(int(k) * v for k, v in p.items())
            ok = (list(p) == ["0", "1", "2"] and _sums_to_one(p)
                  and abs(difficulty["score"] - mean) <= SCORE_TOLERANCE and 0 <= difficulty["score"] <= 2
                  and _is_probability(difficulty["confidence"]))
            return ok, f"score={difficulty['score']}, Σ i·pᵢ={mean:.4f}, probabilities={p}"

        c.guarded("routing: difficulty score is the expected level over probabilities keyed by level", expected_level)
    c.guarded("routing: usage", lambda: _usage_ok(body["usage"]))
    return c.items


def check_support(reply: Reply | None, model: str) -> list[Check]:
    c = _Checks()
    if not _answered(c, "support", reply):
        return c.items
    assert reply is not None
    body = reply.body
    c.expect("support: model is the served name", body.get("model") == model, f"model={body.get('model')!r}")
    labels = ["billing", "shipping", "account"]
    answers = body.get("answers") or {}
    order = list(answers)
    want = [f"problems.{label}" for label in labels] + ["contacts"]
    if not c.expect("support: a noul per set label, then the span's noul, in question order", order == want,
                    f"keys={order}"):
        return c.items
    c.guarded("support: every answer is a noul in [0, 1]", lambda: (
        all(a["type"] == "noul" and _is_probability(a["noul"]) for a in answers.values()), f"answers={answers}"))
    c.guarded("support: thresholds for the set and the span question", lambda: (
        set(body["thresholds"]) == {"problems", "contacts"} and all(map(_is_probability, body["thresholds"].values())),
        f"thresholds={body.get('thresholds')}"))

    def set_shape() -> tuple[bool, str]:
        s = body["sets"]["problems"]
        p, threshold = s["probabilities"], body["thresholds"]["problems"]
        at_threshold = [label for label in labels if p[label] >= threshold]
        ok = (list(p) == labels and all(p[label] == answers[f"problems.{label}"]["noul"] for label in labels)
              and sorted(s["selected"]) == sorted(at_threshold))
        return ok, f"selected={s['selected']}, probabilities={p}, threshold={threshold}"

    if c.guarded("support: sets.problems selects the labels at its threshold; probabilities are the nouls",
                 set_shape):
        selected = body["sets"]["problems"]["selected"]
        c.expect("support: problems selects billing and shipping but not account",
                 "billing" in selected and "shipping" in selected and "account" not in selected,
                 f"selected={selected}")

    def span_shape() -> tuple[bool, str]:
        spans, threshold = body["spans"]["contacts"], body["thresholds"]["contacts"]
        ok = isinstance(spans, list) and all(
            s["label"] == "EMAIL_ADDRESS" and isinstance(s["start"], int) and isinstance(s["end"], int)
            and 0 <= s["start"] < s["end"] <= len(SUPPORT_STATE) and s["text"] == SUPPORT_STATE[s["start"]:s["end"]]
            and _is_probability(s["probability"]) and s["probability"] >= threshold
            for s in spans)
        return ok, f"spans={spans}, threshold={threshold}"

    if c.guarded("support: spans carry the label, code-point offsets with text equal to the slice, probability",
                 span_shape):
        spans = body["spans"]["contacts"]
        c.expect("support: contacts finds jane.doe@example.com at 71–91",
                 any((s["start"], s["end"], s["text"]) == (71, 91, "jane.doe@example.com") for s in spans),
                 f"spans={[(s['start'], s['end'], s['text']) for s in spans]}")
    c.guarded("support: usage", lambda: _usage_ok(body["usage"]))
    return c.items


def check_relevance(reply: Reply | None, model: str) -> list[Check]:
    c = _Checks()
    if not _answered(c, "relevance", reply):
        return c.items
    assert reply is not None
    body = reply.body
    c.expect("relevance: model is the served name", body.get("model") == model, f"model={body.get('model')!r}")
    c.expect("relevance: a batch response has no top-level answers", "answers" not in body,
             f"keys={list(body)}")
    states = body.get("states") or {}
    if not c.expect("relevance: states answered by name", list(states) == ["doc_1", "doc_2"],
                    f"states={list(states)}"):
        return c.items
    nouls: dict[str, float] = {}
    for name, entry in states.items():
        def entry_shape(entry: Any = entry) -> tuple[bool, str]:
            answer = entry["answers"]["relevance"]
            ok = (entry["model"] == model and list(entry["answers"]) == ["relevance"] and answer["type"] == "noul"
                  and _is_probability(answer["noul"]) and _usage_ok(entry["usage"])[0])
            return ok, f"{entry}"

        if c.guarded(f"relevance: {name} answers like a request of its own", entry_shape):
            nouls[name] = entry["answers"]["relevance"]["noul"]
    c.guarded("relevance: usage sums the entries", lambda: (
        _usage_ok(body["usage"])[0]
        and body["usage"]["input_tokens"] == sum(e["usage"]["input_tokens"] for e in states.values()),
        f"usage={body.get('usage')}, entries={[e.get('usage') for e in states.values()]}"))
    if len(nouls) == 2:
        c.expect("relevance: doc_1 is more relevant than doc_2", nouls["doc_1"] > nouls["doc_2"],
                 f"doc_1={nouls['doc_1']}, doc_2={nouls['doc_2']}")
    return c.items


def check_bundle(reply: Reply | None, model: str, domain_model: str = DOMAIN_MODEL) -> list[Check]:
    c = _Checks()
    if not _answered(c, "bundle", reply):
        return c.items
    assert reply is not None
    results = reply.body.get("results") or []
    if not c.expect("bundle: results in task order", [r.get("id") for r in results] == ["domain", "kind"],
                    f"ids={[r.get('id') for r in results]}"):
        return c.items
    domain, kind = results
    c.expect("bundle: every task answered 200", domain.get("status") == 200 and kind.get("status") == 200,
             f"statuses={[r.get('status') for r in results]}, errors={[r.get('error') for r in results]}")

    def classify_shape() -> tuple[bool, str]:
        out = domain["classify"]
        result = out["results"][0]
        ok = (out["model"] == domain_model and len(out["results"]) == 1 and result["label"] in out["labels"]
              and _sums_to_one(result["probabilities"]))
        return ok, f"model={out['model']!r}, label={result['label']!r}"

    if c.guarded("bundle: domain is a classify response", classify_shape):
        label = domain["classify"]["results"][0]["label"]
        c.expect("bundle: domain classifies 'What is 2 + 2?' as math", label == "math", f"label={label!r}")

    def decisions_shape() -> tuple[bool, str]:
        out = kind["decisions"]
        answer = out["answers"]["math"]
        ok = (out["model"] == model and list(out["answers"]) == ["math"] and answer["type"] == "noul"
              and _is_probability(answer["noul"]) and _usage_ok(out["usage"])[0])
        return ok, f"{out}"

    c.guarded("bundle: kind is a decisions response with the math noul", decisions_shape)
    return c.items


def check_replies(replies: Mapping[str, Reply | None], model: str, domain_model: str = DOMAIN_MODEL) -> list[Check]:
    """Every check over already received replies (keys routing, support, relevance, bundle)."""
    return [
        *check_routing(replies.get("routing"), model),
        *check_support(replies.get("support"), model),
        *check_relevance(replies.get("relevance"), model),
        *check_bundle(replies.get("bundle"), model, domain_model),
    ]


def send(client: httpx.Client, path: str, body: dict[str, Any]) -> Reply | None:
    try:
        r = client.post(path, json=body)
    except httpx.HTTPError:
        return None
    try:
        parsed: Any = r.json()
    except ValueError:
        parsed = None
    return Reply(r.status_code, parsed, r.headers)


def check_all(url: str, model: str = DEFAULT_MODEL, domain_model: str = DOMAIN_MODEL,
              client: httpx.Client | None = None) -> list[Check]:
    """Send the spec's four requests to `url` and check the replies."""
    own = client is None
    http = client or httpx.Client(base_url=url, timeout=60.0)
    try:
        replies = {name: send(http, path, body) for name, (path, body) in _requests(model, domain_model).items()}
    finally:
        if own:
            http.close()
    return check_replies(replies, model, domain_model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="gateway base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="served decisions model (the spec's Vela 2.0)")
    parser.add_argument("--domain-model", default=DOMAIN_MODEL, help="classify model of the bundle example")
    args = parser.parse_args(argv)
    checks = check_all(args.url, args.model, args.domain_model)
    for check in checks:
        print(check.line())
    failed = sum(not check.ok for check in checks)
    print(f"{len(checks) - failed}/{len(checks)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
