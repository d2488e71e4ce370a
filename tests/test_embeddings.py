"""Embeddings (issue 18): Model.embed against llama.cpp's own llama-embedding, built from the pinned
tree and the extension's libraries, on the same files: a BERT-architecture GGUF written here (its
own pooling type, mean and cls) and SmolLM2 (a decoder, mean and last pooling); batching does not
change a vector; long texts and misuse are typed errors; /v1/embeddings answers with the same
vectors through the openai client, as floats and in base64."""

from __future__ import annotations

import base64
import json
import math
import struct
import subprocess
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from llamaspec_fixtures import BertFixtureInfo, write_bert_fixture

import llamaspec
from llamaspec import ContextOverflowError, InvalidOptionError

from .oracles import llama_embedding
from .server_util import Server, running

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A river runs through the city.",
    "hello",
    "Embeddings map text to vectors; similar texts get similar vectors!",
    "3 + 4 = 7, said the cat.",
]


@pytest.fixture(scope="module")
def bert_mean(tmp_path_factory: pytest.TempPathFactory) -> BertFixtureInfo:
    return write_bert_fixture(tmp_path_factory.mktemp("bert") / "bert-mean.gguf", pooling="mean", seed=1)


@pytest.fixture(scope="module")
def bert_cls(tmp_path_factory: pytest.TempPathFactory) -> BertFixtureInfo:
    return write_bert_fixture(tmp_path_factory.mktemp("bert") / "bert-cls.gguf", pooling="cls", seed=2)


def upstream(path: str, texts: list[str], *args: str) -> list[list[float]]:
    """llama-embedding's vectors (one per line of the prompt), printed as a JSON array. It prints
    each number and each comma as a log entry of common's asynchronous logger, which once in CI
    printed a number twice in place of the comma after it (malformed JSON): such a run is repeated,
    at most twice."""
    for attempt in range(3):
        out = subprocess.run([str(llama_embedding()), "-m", path, "-p", "\n".join(texts), "-t", "2",
                              "--embd-output-format", "array", *args], check=True, capture_output=True,
                             text=True, timeout=300).stdout
        try:
            vectors: list[list[float]] = json.loads(out[out.index("[["):])
            return vectors
        except json.JSONDecodeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def assert_close(got: list[list[float]], want: list[list[float]], tol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        assert max(abs(a - b) for a, b in zip(g, w)) < tol


@pytest.mark.parametrize("which", ["bert_mean", "bert_cls"])
def test_an_embedding_gguf_equals_llama_embedding(which: str, request: pytest.FixtureRequest) -> None:
    """The file's own pooling type; normalized (the default) and raw; llama-embedding prints 7
    decimals."""
    info: BertFixtureInfo = request.getfixturevalue(which)
    with llamaspec.Model(info.path) as m:
        got = m.embed(SENTENCES, n_threads=2)
        raw = m.embed(SENTENCES, normalize=False, n_threads=2)
    assert len(got[0]) == info.n_embd
    assert_close(got, upstream(info.path, SENTENCES), 2e-6)
    assert_close(raw, upstream(info.path, SENTENCES, "--embd-normalize", "-1"), 2e-5)
    for v in got:
        assert math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5)
    assert any(abs(a - b) > 1e-3 for a, b in zip(raw[0], got[0]))


@pytest.mark.real_model
@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_a_decoder_model_equals_llama_embedding(smol: llamaspec.Model, smol_path: str, pooling: str) -> None:
    """Both sides with a 2048-token context (ours by default for a decoder) and llama.cpp's ubatch."""
    got = smol.embed(SENTENCES, pooling=pooling, n_threads=2)
    assert len(got[0]) == smol.n_embd
    assert_close(got, upstream(smol_path, SENTENCES, "--pooling", pooling, "-c", "2048"), 2e-6)
    if pooling == "mean":
        assert smol.embed(SENTENCES, n_threads=2) == got  # mean: a decoder's default


def test_batching_does_not_change_a_vector(bert_mean: BertFixtureInfo) -> None:
    """Alone or packed with others (several batches: 40 texts over a 128-token context), a text's
    vector is the same but for float rounding: ggml's matrix kernels sum in another order for another
    batch shape (~1e-4 here, where the fixture's weights are scaled up; llama-embedding alike)."""
    texts = [f"{SENTENCES[i % len(SENTENCES)]} {i}" for i in range(40)]
    with llamaspec.Model(bert_mean.path) as m:
        together = m.embed(texts)
        alone = [m.embed([t])[0] for t in texts[:6]]
        ids = [m.tokenize(t) for t in texts[:6]]
        assert m.embed(ids) == m.embed(texts[:6])  # ids or the texts they come from: the same batch
    assert_close(alone, together[:6], 1e-3)


def test_threads_embed_at_once(bert_mean: BertFixtureInfo) -> None:
    """Several threads on one Model (the server's worker threads do this): each gets its own texts'
    vectors, nothing waits forever (a call waits for the embedding context without the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [[f"{s} {i}" for s in SENTENCES] for i in range(4)]
    with llamaspec.Model(bert_mean.path) as m:
        want = [m.embed(t) for t in texts]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(m.embed, texts * 3))
    for i, g in enumerate(got):
        assert g == want[i % 4]


def test_long_texts_error_or_truncate(bert_mean: BertFixtureInfo) -> None:
    """Over the context (the fixture's training context, 128 positions): ContextOverflowError, or
    with truncate=True the first tokens and the end token, which is what the truncated ids give."""
    long = " ".join(["fox"] * 300)
    with llamaspec.Model(bert_mean.path) as m:
        with pytest.raises(ContextOverflowError, match="more than the embedding context"):
            m.embed([long])
        cut = m.embed([long], truncate=True)
        ids = m.tokenize(long)
        assert_close(cut, m.embed([ids[:127] + ids[-1:]]), 1e-9)
        with pytest.raises(ContextOverflowError):
            m.embed([long], n_ctx=64)


def test_misuse_is_a_typed_error(bert_mean: BertFixtureInfo) -> None:
    bad: list[tuple[Any, dict[str, Any], str]] = [
        ([], {}, "empty"),
        ("a text", {}, "list of strings"),
        ([b"bytes"], {}, "str or a list of token ids"),
        ([7], {}, "str or a list of token ids"),
        (["x"], {"pooling": "max"}, "pooling"),
        (["x"], {"normalize": 1}, "normalize"),
        (["x"], {"n_ctx": 0}, "n_ctx"),
        ([[bert_mean.n_vocab + 5]], {}, "out of range|invalid token"),
        ([[]], {}, "no tokens"),
    ]
    with llamaspec.Model(bert_mean.path) as m:
        for texts, kw, match in bad:
            with pytest.raises(InvalidOptionError, match=match):
                m.embed(texts, **kw)
    closed = llamaspec.Model(bert_mean.path)
    closed.close()
    with pytest.raises(llamaspec.ClosedError):
        closed.embed(["x"])


# -- HTTP ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(bert_mean: BertFixtureInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running(bert_mean.path, "-c", "256", "-t", "2", "--embeddings",
                 log_dir=tmp_path_factory.mktemp("embed-logs")) as s:
        yield s


def test_v1_embeddings_equal_the_library(server: Server, bert_mean: BertFixtureInfo) -> None:
    """The openai client, floats and base64 (it decodes base64 itself), a single string and token ids."""
    with llamaspec.Model(bert_mean.path) as m:
        want = m.embed(SENTENCES)
        ids = m.tokenize(SENTENCES[0])
        n_tokens = sum(len(m.tokenize(t)) for t in SENTENCES)
        want_one = m.embed(SENTENCES[:1])  # alone: another batch shape, other last bits
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)
    r = c.embeddings.create(model="x", input=SENTENCES, encoding_format="float")
    assert [d.index for d in r.data] == list(range(len(SENTENCES)))
    assert_close([d.embedding for d in r.data], want, 1e-6)
    assert r.usage.prompt_tokens == n_tokens
    # without encoding_format the client asks for base64 and decodes it (numpy-free: to floats)
    auto = c.embeddings.create(model="x", input=SENTENCES)
    assert_close([list(map(float, d.embedding)) for d in auto.data], want, 1e-6)  # float32 on the wire
    b64 = c.embeddings.create(model="x", input=SENTENCES, encoding_format="base64")
    raw = [base64.b64decode(str(d.embedding)) for d in b64.data]
    assert_close([list(struct.unpack(f"<{len(b) // 4}f", b)) for b in raw], want, 1e-6)
    one = c.embeddings.create(model="x", input=SENTENCES[0])
    assert len(one.data) == 1
    assert_close([one.data[0].embedding], want_one, 1e-6)
    by_ids = c.embeddings.create(model="x", input=[ids])
    assert_close([by_ids.data[0].embedding], want_one, 1e-6)


@pytest.mark.parametrize("body", [{}, {"input": []}, {"input": " ".join(["fox"] * 300)},
                                  {"input": "x", "encoding_format": "hex"}])
def test_bad_embedding_requests_are_400(server: Server, body: dict[str, Any]) -> None:
    import httpx

    r = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"

