"""Log-probabilities (issue 18): ``logprobs=True, top_logprobs=n`` puts on every Token the
log-softmax of the target's raw logits at its position (checked against the logits a plain
Context gives for the same tokens, with numpy), or with ``post_sampling_probs=True`` the distribution
the sampler drew from; speculation changes neither the ids nor their order, and values only by
float rounding; every misuse is a typed error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import llamaspec
from llamaspec import InvalidOptionError, Speculative, Token

from .conftest import assert_same_logprobs as assert_same
from .conftest import token_ids

ASK = [{"role": "user", "content": "What is the best book?"}]


def tokens(events: Any) -> list[Token]:
    return [ev for ev in events if isinstance(ev, Token)]


@pytest.mark.real_model
def test_speculation_reports_plain_decodings_logprobs(smol: llamaspec.Model, smol_path: str) -> None:
    """Greedy and seeded: a draft model (the same weights) and an n-gram drafter give plain
    decoding's tokens, and each token's log-probability and top candidates within 1e-3."""
    cases: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 0.8, "seed": 11}]
    with llamaspec.Generator(smol, n_ctx=512, n_threads=2) as plain:
        want = [tokens(plain.stream_events(messages=ASK, max_tokens=48, logprobs=True, top_logprobs=5, **c))
                for c in cases]
        bare = token_ids(plain.stream_events(messages=ASK, max_tokens=48, **cases[0]))
        assert bare == [t.id for t in want[0]]
    drafters: list[tuple[str, dict[str, Any]]] = [("draft", {"draft_model": smol_path}), ("ngram-simple", {})]
    for method, kw in drafters:
        with Speculative(smol, method=method, n_draft=4, n_ctx=512, n_threads=2, **kw) as spec:
            for c, w in zip(cases, want):
                assert_same(w, tokens(spec.stream_events(messages=ASK, max_tokens=48, logprobs=True,
                                                         top_logprobs=5, **c)))
            if method == "draft":
                assert spec.stats().drafts_accepted > 0


def test_mtp_reports_plain_decodings_logprobs(fx: llamaspec.Model) -> None:
    """The MTP fixture, its drafts partly accepted: the same tokens and probabilities as plain."""
    prompt = list(b"abcabd")
    for c in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
        with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as plain:
            want = tokens(plain.stream_events(prompt, 40, logprobs=True, top_logprobs=20, **c))
        with llamaspec.MTP(fx, n_draft=3, n_ctx=256, n_threads=1) as spec:
            got = tokens(spec.stream_events(prompt, 40, logprobs=True, top_logprobs=20, **c))
            assert spec.stats().drafts_generated > 0
        assert_same(want, got)


@pytest.mark.real_model
def test_values_are_the_log_softmax_of_the_raw_logits(smol: llamaspec.Model) -> None:
    """Each value equals log_softmax(logits) at that position, the logits read from a plain Context
    decoding the same tokens one at a time; top candidates are the largest, in order."""
    prompt = smol.apply_chat_template(ASK, tokenize=True)
    with llamaspec.Generator(smol, n_ctx=512, n_threads=2) as gen:
        got = tokens(gen.stream_events(prompt, 12, temperature=0.7, seed=2, logit_bias={504: -3.0},
                                       logprobs=True, top_logprobs=8))
    with llamaspec.Context(smol, n_ctx=512, n_threads=2) as ctx:
        ctx.decode(prompt)
        pos = len(prompt)
        for t in got:
            logits = ctx.logits().astype(np.float64)
            lsm = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
            assert t.logprob == pytest.approx(lsm[t.id], abs=2e-3)
            order = np.argsort(-lsm, kind="stable")[:8]
            assert t.top_logprobs is not None and len(t.top_logprobs) == 8
            assert [c.id for c in t.top_logprobs] == order.tolist()
            for c in t.top_logprobs:
                assert c.logprob == pytest.approx(lsm[c.id], abs=2e-3)
                assert c.bytes == smol.token_to_piece(c.id)
                assert c.text == c.bytes.decode("utf-8", "replace")
            ctx.decode([t.id], pos)
            pos += 1


@pytest.mark.real_model
def test_post_sampling_probs_are_the_samplers_distribution(smol: llamaspec.Model) -> None:
    """After the sampler's filters (top_k 40, top_p, min_p, temperature): only tokens it left a
    chance, their probabilities summing to at most 1 (exactly 1 when all of them are listed), the
    sampled token among them; greedy leaves one token with probability 1."""
    with llamaspec.Generator(smol, n_ctx=512, n_threads=2) as gen:
        got = tokens(gen.stream_events(messages=ASK, max_tokens=16, temperature=1.0, seed=7, logprobs=True,
                                       top_logprobs=10, post_sampling_probs=True))
        for t in got:
            assert t.top_logprobs is not None and 1 <= len(t.top_logprobs) <= 10
            probs = [math.exp(c.logprob) for c in t.top_logprobs]
            assert probs == sorted(probs, reverse=True)
            assert 0 < sum(probs) <= 1 + 1e-5
            if len(probs) < 10:
                assert sum(probs) == pytest.approx(1.0, abs=1e-4)
                assert t.id in [c.id for c in t.top_logprobs]
            assert t.logprob is not None and t.logprob <= 0
        greedy = tokens(gen.stream_events(messages=ASK, max_tokens=4, temperature=0, logprobs=True,
                                          top_logprobs=5, post_sampling_probs=True))
        for t in greedy:
            assert t.logprob == 0.0
            assert t.top_logprobs is not None and [c.id for c in t.top_logprobs] == [t.id]


def test_logprobs_off_and_top_zero(fx: llamaspec.Model) -> None:
    """Without logprobs Token carries none; logprobs=True alone gives the token's value and no top
    list; every token of the call carries them, held-back text (a stop string's start) included."""
    with llamaspec.Generator(fx, n_ctx=128, n_threads=1) as gen:
        plain = tokens(gen.stream_events(list(b"abc"), 8, temperature=0))
        assert all(t.logprob is None and t.top_logprobs is None for t in plain)
        bare = tokens(gen.stream_events(list(b"abc"), 8, temperature=0, logprobs=True))
        assert [t.id for t in bare] == [t.id for t in plain]
        assert all(t.logprob is not None and t.logprob <= 0 and t.top_logprobs == () for t in bare)
        text = "".join(t.text for t in plain)
        stop = text[3:5]  # held back for a token, then found
        cut = tokens(gen.stream_events(list(b"abc"), 8, temperature=0, stop=[stop], logprobs=True,
                                       top_logprobs=2))
        assert "".join(t.text for t in cut) == text[:3]
        assert any(t.text == "" for t in cut)  # the stop string's first byte, held, then dropped
        assert all(t.top_logprobs is not None and len(t.top_logprobs) == 2 for t in cut)


@pytest.mark.parametrize("options, message", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be <= 20"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs must be >= 0"),
    ({"logprobs": True, "top_logprobs": 2.0}, "top_logprobs must be an int"),
    ({"logprobs": 1}, "logprobs must be a bool"),
    ({"top_logprobs": 3}, "top_logprobs needs logprobs=True"),
    ({"post_sampling_probs": True}, "post_sampling_probs needs logprobs=True"),
])
def test_misuse_is_an_invalid_option_error(fx: llamaspec.Model, options: dict[str, Any],
                                           message: str) -> None:
    with llamaspec.Generator(fx, n_ctx=64, n_threads=1) as gen:
        with pytest.raises(InvalidOptionError, match=message):
            gen.generate(list(b"abc"), 4, **options)


def test_the_native_start_checks_its_logprobs_arguments(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=64, n_threads=1) as gen:
        with pytest.raises(InvalidOptionError, match="top_logprobs must be in"):
            gen._require().start(list(b"abc"), 4, [], {}, "root", logprobs=21)
        with pytest.raises(InvalidOptionError, match="post_sampling_probs needs logprobs"):
            gen._require().start(list(b"abc"), 4, [], {}, "root", post_sampling_probs=True)
