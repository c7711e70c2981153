"""How a two-part preset's pair is read by the card's instruction LM (issue 22, feature set M).

The relevance and grounded heads read, beside the encoder's embeddings and the cheap signals, the hidden state of
Qwen2.5-Coder-0.5B-Instruct (served by Triton as `qwen-coder-state`: its first 16 layers, the state at the last
prompt token) over one ChatML prompt per pair: a fixed system line and a fixed yes/no question per kind, written
before any run (tools/decisions_eval/RUNS.md, 2026-12-06 20:12). Cross-validated on train lines only, the state
raised relevance 0.7489 → 0.8274 and grounded 0.6821 → 0.7201 (tools/pair_features_cv, set M); the LM's own
yes/no answer added nothing (set K), so only the state is read.

The build (sr_build/presets.py) and the family render prompts with this one function, so the two cannot drift.
"""

from __future__ import annotations

from ...text import TextEncoder

SYSTEM = "You are a strict classifier. Answer with yes or no only."
PROMPTS = {
    "relevance": "Question: {0}\nPassage: {1}\nDoes the passage answer the question? A passage on the same topic that "
                 "does not give the answer is no.",
    "grounded": "Context: {0}\nAnswer: {1}\nIs every claim in the answer supported by the context? An answer that "
                "adds, changes or contradicts a fact, a number or a name is no.",
}
# Tokens of each part the LM reads: the encoder's own window (the head's embeddings read no more of a part either),
# which keeps a prompt under 600 tokens (its frame is about 60). Train pairs are far shorter (prompts 85–141
# tokens, p10–p90), so no fitted row was cut.
PART_TOKENS = 256


def reads_state(kind: str) -> bool:
    """Whether heads of this feature kind read the LM's state (where the card names an LM)."""
    return kind in PROMPTS


def frame(user: str) -> str:
    """Qwen2.5's chat template, system line first, ending with the assistant's header (add_generation_prompt):
    the state is read at its last token, where the model would start its answer."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


def chatml(kind: str, first: str, second: str) -> str:
    """The registered prompt of a pair of this kind, framed."""
    return frame(PROMPTS[kind].format(first, second))


def cut(encoder: TextEncoder, text: str, tokens: int = PART_TOKENS) -> str:
    """`text` up to the end of its first `tokens` tokens (by the LM's tokenizer), whole when it is shorter."""
    encoded = encoder.encode(text, max_tokens=tokens + encoder.layout.size, overflow="truncate")
    if not encoded.truncated:
        return text
    return text[:max((end for (_, end), seq in zip(encoded.offsets, encoded.sequence_ids, strict=True)
                      if seq is not None), default=0)]


def prompt(encoder: TextEncoder, kind: str, texts: list[str]) -> str:
    """The prompt the LM reads for a pair of this kind, each part cut to PART_TOKENS."""
    first, second = (cut(encoder, t) for t in texts)
    return chatml(kind, first, second)
