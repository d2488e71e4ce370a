"""MTP speculative decoding on the generated fixtures: lossless, exact limits, consistent stats,
cancel/reuse, typed errors."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from llamaspec_fixtures import FixtureInfo

import llamaspec
from llamaspec import MTP, BusyError, Done, EndOfGeneration, InvalidOptionError, UnsupportedModelError

from .conftest import proc_threads, settled_threads, token_ids

pytestmark = pytest.mark.fixture

LEVELS = ["100", "74", "0"]



def prompts_for(m: llamaspec.Model, info: FixtureInfo) -> list[str]:
    # one prompt off the cycle (the first draft cannot know it), one on it, one special-token prompt
    return ["hello", m.detokenize(info.cycle[10:16]), "<|im_start|>user\nhi<|im_end|>"]


@pytest.mark.parametrize("level", LEVELS)
def test_greedy_mtp_equals_plain_greedy(fx_mtp_levels: dict[str, FixtureInfo], level: str) -> None:
    info = fx_mtp_levels[level]
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=512, n_threads=1) as plain:
        cases = [(p, n) for p in prompts_for(m, info) for n in (1, 2, 7, 50, 129)]
        expected = {c: token_ids(list(plain.stream_events(c[0], c[1], temperature=0))) for c in cases}
        for n_draft in range(1, 6):
            with MTP(m, n_draft=n_draft, n_ctx=512, n_threads=1) as mtp:  # one session, reused
                for prompt, max_tokens in cases:
                    events = list(mtp.stream_events(prompt, max_tokens, temperature=0))
                    got = token_ids(events)
                    assert got == expected[(prompt, max_tokens)], (level, prompt, max_tokens, n_draft)
                    assert len(got) == max_tokens  # exact, also in the middle of an accepted run
                    assert isinstance(events[-1], Done) and events[-1].stats.tokens == max_tokens


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n_draft", [1, 2, 3, 4, 5])
def test_acceptance_is_what_the_fixture_was_built_for(fx_mtp_levels: dict[str, FixtureInfo], level: str,
                                                      n_draft: int) -> None:
    info = fx_mtp_levels[level]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=n_draft, n_ctx=512, n_threads=1) as mtp:
        prompt = m.detokenize(info.cycle[20:28])  # on the cycle: the first draft can be right
        mtp.generate(prompt, 256, temperature=0)
        st = mtp.stats()
        predicted = info.simulate_mtp(m.tokenize(prompt), n_draft, 256)
        assert (st.iterations, st.drafts_generated, st.drafts_accepted) == predicted
        if level == "100":
            assert st.acceptance_rate == 1.0
        elif level == "0":
            assert st.acceptance_rate == 0.0 and st.drafts_generated > 0
        else:
            rate = predicted[2] / predicted[1]
            assert abs(st.acceptance_rate - rate) <= 0.03
            if n_draft == 3:
                assert 0.70 <= st.acceptance_rate <= 0.78  # "about 74%" by construction


def test_stats_are_consistent(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=1024, n_threads=1) as mtp:
        total_tokens = 0
        for prompt, n in (("hello", 100), ("abc", 37), ("xyz", 250)):
            events = list(mtp.stream_events(prompt, n, temperature=0))
            done = events[-1]
            assert isinstance(done, Done)
            tokens = token_ids(events)
            total_tokens += len(tokens)
            assert done.stats.tokens == len(tokens)
            assert done.stats.iterations > 0 and done.stats.drafts_accepted <= done.stats.drafts_generated
        st = mtp.stats()
        assert st.tokens_emitted == total_tokens
        assert st.acceptance_rate == pytest.approx(st.drafts_accepted / st.drafts_generated)
        assert st.drafts_generated <= st.n_draft * st.iterations
        assert st.mean_accepted_length == pytest.approx(st.drafts_accepted / st.iterations + 1)
        assert len(st.accepted_per_position) == 3 == len(st.drafted_per_position)
        assert sum(st.accepted_per_position) == st.drafts_accepted
        assert sum(st.drafted_per_position) == st.drafts_generated
        assert all(a <= d for a, d in zip(st.accepted_per_position, st.drafted_per_position))
        assert st.tokens_per_second > 0
        assert all(st.timing_us[k] > 0 for k in ("draft", "verify", "sample", "prefill", "total"))
        text = mtp.print_stats()
        assert "draft-mtp" in text and "#mean acc len" in text and "acceptance" in text
        mtp.reset_stats()
        z = mtp.stats()
        assert (z.iterations, z.drafts_generated, z.tokens_emitted, z.acceptance_rate) == (0, 0, 0, 0.0)


@pytest.mark.parametrize("level", LEVELS)
def test_token_origin_agrees_with_the_stats(fx_mtp_levels: dict[str, FixtureInfo], level: str) -> None:
    # each token says how it came: an accepted draft, the target's own token of a step that verified
    # drafts (one per such step), or a plain step (the first token; steps without a draft)
    info = fx_mtp_levels[level]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=512, n_threads=1) as mtp, \
            llamaspec.Generator(m, n_ctx=512, n_threads=1) as plain:
        tokens = [e for e in mtp.stream_events("hello", 80, temperature=0) if isinstance(e, llamaspec.Token)]
        st = mtp.stats()
        origins = [t.origin for t in tokens]
        assert origins[0] == "plain"
        # exact here: no stop string, no end-of-generation inside a draft, and MTP (p_min 0) always
        # drafts the length it is asked for, which the histogram counts
        assert origins.count("draft") == st.drafts_accepted
        assert origins.count("target") == st.iterations - st.draft_length_histogram[0]
        # the fixture is hybrid: its first token comes from a step of its own (the held-back last
        # prompt token, ADR 0018), one of the steps without a draft
        assert origins.count("plain") == st.draft_length_histogram[0]
        # each "target" token says how many drafts its step proposed; the others say 0
        assert sum(t.drafted for t in tokens) == st.drafts_generated
        # (3, but for the last steps, whose drafts the tokens still wanted cap): the histogram's counts
        lengths = Counter(t.drafted for t in tokens if t.origin == "target")
        assert lengths == {k: n for k, n in enumerate(st.draft_length_histogram) if k > 0 and n > 0}
        assert max(lengths) == 3
        assert all(t.drafted == 0 for t in tokens if t.origin != "target")
        if level == "0":
            assert "draft" not in origins and "target" in origins
        # a run of drafts always ends with the target's token: a "draft" is followed by another or by it
        assert all(b in ("draft", "target") for a, b in zip(origins, origins[1:]) if a == "draft")
        plain_tokens = [t for t in plain.stream_events("hello", 80, temperature=0)
                        if isinstance(t, llamaspec.Token)]
        assert {t.origin for t in plain_tokens} == {"plain"}
        assert tokens == plain_tokens  # the origin is not part of a Token's equality


def test_stats_readable_mid_stream_from_another_thread(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=4, n_ctx=2048, n_threads=1) as mtp:
        snapshots: list[llamaspec.SpecStats] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                snapshots.append(mtp.stats())
                time.sleep(0.0005)

        t = threading.Thread(target=reader)
        t.start()
        try:
            mtp.generate("hello", 1800, temperature=0)
        finally:
            stop.set()
            t.join()
        assert len(snapshots) > 10
        seen_mid = [s for s in snapshots if 0 < s.tokens_emitted < 1800]
        assert seen_mid, "no snapshot taken while the generation ran"
        for s in snapshots:
            assert s.drafts_accepted <= s.drafts_generated <= s.n_draft * s.iterations
            assert 0.0 <= s.acceptance_rate <= 1.0
            assert sum(s.accepted_per_position) == s.drafts_accepted


def test_seeded_sampling_equals_plain(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    # verification draws one sample per emitted token from the target's distribution, as plain does
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=512, n_threads=1) as g, \
            MTP(m, n_draft=3, n_ctx=512, n_threads=1) as mtp:
        for temperature in (1.0, 20.0):
            kw = dict(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
            plain = g.generate("hello", 200, **kw)
            spec = mtp.generate("hello", 200, **kw)
            assert spec == plain
            if temperature == 20.0:
                assert len(set(plain)) > 30  # really sampled, not the greedy cycle


def test_stop_strings_and_grammar_with_mtp(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=5, n_ctx=512, n_threads=1) as mtp:
        full = mtp.generate("hello", 100, temperature=0)
        stop = full[41:44]
        text = mtp.generate("hello", 100, temperature=0, stop=[stop])
        assert text == full[: full.index(stop)]
        assert mtp.last_stats is not None and mtp.last_stats.finish_reason == "stop"
        constrained = mtp.generate("hello", 40, temperature=0, grammar='root ::= [a-f]+')
        assert constrained and set(constrained) <= set("abcdef")


def test_model_without_mtp_layers(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m:
        with pytest.raises(UnsupportedModelError, match="nextn_predict_layers") as ei:
            MTP(m)
        assert fx_nomtp_info.path in str(ei.value) and ei.value.path == fx_nomtp_info.path
    with llamaspec.Model(fx_nomtp_info.path) as m:  # the native check too (it must not abort)
        with pytest.raises(UnsupportedModelError, match="no MTP layers"):
            llamaspec._native.Session.create(m._require(), {"n_ctx": 256},
                                                 {"methods": ["draft-mtp"], "n_draft": 3}, None)


def test_model_loaded_without_mtp(fx_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_info.path, load_mtp=False) as m:
        assert m.has_mtp and not m.mtp_loaded
        with pytest.raises(UnsupportedModelError, match="load_mtp=True"):
            MTP(m)
        # the trunk still generates
        with llamaspec.Generator(m, n_ctx=256, n_threads=1) as g:
            assert len(g.generate("hi", 5, temperature=0)) == 5


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True])
def test_invalid_n_draft(fx: llamaspec.Model, bad: object) -> None:
    with pytest.raises(InvalidOptionError):
        MTP(fx, n_draft=bad)  # type: ignore[arg-type]


def test_unknown_option(fx: llamaspec.Model) -> None:
    with pytest.raises(TypeError):
        MTP(fx, n_drafts=3)


def test_cancel_and_reuse_gives_fresh_output(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m:
        with MTP(m, n_draft=3, n_ctx=512, n_threads=1) as fresh:
            reference = fresh.generate("hello", 120, temperature=0)
        with MTP(m, n_draft=3, n_ctx=512, n_threads=1) as mtp:
            threads_before = proc_threads()
            for i in range(200):
                got = []
                for piece in mtp.stream("qwerty" if i % 2 else "hello", 200, temperature=0):
                    got.append(piece)
                    if len(got) == 3:
                        break
                assert not mtp.busy
                if i % 40 == 0:
                    assert mtp.generate("hello", 120, temperature=0) == reference
            assert mtp.generate("hello", 120, temperature=0) == reference
            assert settled_threads(threads_before) <= threads_before


def test_cancel_during_prompt_then_reuse(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=8192, n_threads=1, n_batch=64,
                                               n_ubatch=64) as mtp:
        reference = mtp.generate("hello", 60, temperature=0)
        prompt = "abcdefgh" * 900  # 7,200 prompt tokens in 64-token chunks
        t0 = time.perf_counter()
        list(mtp.stream_events(prompt, 2, temperature=0, cache_prompt=False))
        full = time.perf_counter() - t0
        timer = threading.Timer(full / 10, mtp.cancel)
        timer.start()
        t0 = time.perf_counter()
        events = list(mtp.stream_events(prompt, 2, temperature=0, cache_prompt=False))
        elapsed = time.perf_counter() - t0
        timer.join()
        assert isinstance(events[-1], Done) and events[-1].stats.finish_reason == "cancelled"
        assert elapsed < full * 0.6, (elapsed, full)
        assert mtp.generate("hello", 60, temperature=0) == reference


def test_busy(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=1024, n_threads=1) as mtp:
        it = mtp.stream_events("abc", 900)
        next(it)
        with pytest.raises(BusyError):
            mtp.generate("abc", 4)
        it.close()
        assert mtp.generate("abc", 4, temperature=0)


def test_async_and_events(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    import asyncio

    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=512, n_threads=1) as mtp:
        prompt = m.detokenize(info.cycle[:6])
        expected = mtp.generate(prompt, 40, temperature=0)

        async def main() -> str:
            return "".join([p async for p in mtp.astream(prompt, 40, temperature=0)])

        assert asyncio.run(main()) == expected
        # the prompt comes from the cache (a checkpoint: the fixture is hybrid) and MTP drafts from
        # the hidden row it had there (patch 0008), so every draft is as constructed
        events = list(mtp.stream_events(prompt, 40, temperature=0))
        assert not any(isinstance(e, EndOfGeneration) for e in events)
        done = events[-1]
        assert isinstance(done, Done)
        assert done.stats.cached_tokens == len(m.tokenize(prompt)) - 1
        assert done.stats.iterations > 0 and done.stats.acceptance_rate == 1.0


def test_mtp_on_q8_0_fixture(fx_q8_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_q8_info.path) as m, llamaspec.Generator(m, n_ctx=512, n_threads=1) as g, \
            MTP(m, n_draft=3, n_ctx=512, n_threads=1) as mtp:
        assert mtp.generate("hello", 100, temperature=0) == g.generate("hello", 100, temperature=0)
        assert mtp.stats().acceptance_rate > 0.9


def test_emit_stats_every(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=512, n_threads=1) as mtp:
        events = list(mtp.stream_events("hello", 100, temperature=0, emit_stats_every=10))
        stats = [e for e in events if isinstance(e, llamaspec.Stats)]
        assert len(stats) == 10
        emitted = [s.snapshot.tokens_emitted for s in stats]
        assert emitted == sorted(emitted) and all(0 < x <= 100 for x in emitted)
        assert all(s.snapshot.drafts_accepted <= s.snapshot.drafts_generated for s in stats)
        assert isinstance(events[-1], Done)
        # stats are not part of the text, and a plain stream accepts the option too
        assert "".join(mtp.stream("hello", 100, temperature=0, emit_stats_every=10)) == \
            mtp.generate("hello", 100, temperature=0)
        with pytest.raises(InvalidOptionError):
            mtp.stream_events("hello", 10, emit_stats_every=-1)


def test_closed_session(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m:
        mtp = MTP(m, n_draft=2, n_ctx=256, n_threads=1)
        assert mtp.generate("abc", 5, temperature=0)
        mtp.close()
        mtp.close()  # idempotent
        with pytest.raises(llamaspec.ClosedError):
            mtp.stats()
        with pytest.raises(llamaspec.ClosedError):
            mtp.generate("abc", 5)


def test_edge_prompts(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=256, n_threads=1) as g, \
            MTP(m, n_draft=3, n_ctx=256, n_threads=1) as mtp:
        # a one-token prompt: nothing to prefill, the drafter starts without hidden rows
        for prompt in ("a", [65], "ab"):
            assert mtp.generate(prompt, 40, temperature=0) == g.generate(prompt, 40, temperature=0)
        # prompt + max_tokens exactly fills the context: drafts are capped by the room left
        n = mtp.n_ctx
        assert mtp.generate("x" * (n - 10), 10, temperature=0) == g.generate("x" * (n - 10), 10, temperature=0)
