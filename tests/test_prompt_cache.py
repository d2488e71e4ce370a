"""The prompt cache: a call reuses what its sequence's memory still holds of its prompt. First of all
it is lossless: every call gives the tokens a call without the cache gives (greedy and seeded), for
plain decoding and every drafter, after an extension, a divergence inside the prompt, the same prompt
again, a cancel in the middle of a prompt, on hybrid models (the fixtures: checkpoints of their
recurrent state) and on attention-only ones (SmolLM2: the cache is cut at any position)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import llamaspec
from llamaspec import MTP, Done, InvalidOptionError, PromptProgress, Speculative
from llamaspec_fixtures import (
    FixtureInfo,
    write_dflash_fixture,
    write_draft_fixture,
    write_eagle3_fixture,
)

from .conftest import token_ids

Session = llamaspec.Generator | Speculative


def call(s: Session, prompt: list[int], n: int, **kw: Any) -> tuple[list[int], llamaspec.GenerationStats]:
    events = list(s.stream_events(prompt, n, **kw))
    done = events[-1]
    assert isinstance(done, Done)
    return token_ids(events), done.stats


def turns(model: llamaspec.Model, first: list[int]) -> Callable[[list[int]], list[list[int]]]:
    """The prompts of a conversation-like run, built from what the first call generated."""

    def build(gen: list[int]) -> list[list[int]]:
        other = model.tokenize(" a different question entirely", add_special=False)
        return [
            first + gen + other,           # the next turn: the whole last call is reused
            first + other,                  # back to the first prompt, another continuation
            first + other,                  # the same prompt again
            first[: len(first) // 2] + other,  # diverges inside the first prompt
        ]

    return build


def check_lossless(model: llamaspec.Model, make: Callable[[], Session], first: list[int], n: int = 24,
                   **sampling: Any) -> list[int]:
    """Runs the turns with the cache and, on a second session, without it; returns the cached counts."""
    with make() as cached, make() as fresh:
        want0, _ = call(fresh, first, n, cache_prompt=False, **sampling)
        got0, st0 = call(cached, first, n, **sampling)
        assert got0 == want0 and st0.cached_tokens == 0
        counts = []
        for prompt in turns(model, first)(got0):
            want, _ = call(fresh, prompt, n, cache_prompt=False, **sampling)
            got, st = call(cached, prompt, n, **sampling)
            assert got == want, (prompt, st.cached_tokens)
            assert 0 <= st.cached_tokens < len(prompt) == st.prompt_tokens
            counts.append(st.cached_tokens)
        assert cached.stats().cached_tokens == sum(counts)
        assert fresh.stats().cached_tokens == 0
        return counts


@pytest.mark.fixture
def test_mtp_on_a_hybrid_model_reuses_through_checkpoints(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m:
        first = m.tokenize("hello " * 20)
        n = 24

        def make() -> Session:
            return MTP(m, n_draft=3, n_ctx=512, n_threads=1)

        counts = check_lossless(m, make, first, n, temperature=0)
        # 1. the next turn: everything the last call left (its prompt and all it generated but the
        #    last token, which was never decoded)
        assert counts[0] == len(first) + n - 1
        # 2. another continuation of the first prompt: the recurrent state cannot go back 40 tokens,
        #    so it restarts from the checkpoint taken at the end of the first prompt (all of it but
        #    its last token, which a speculative call decodes with its first verify)
        assert counts[1] == len(first) - 1
        # 3. the same prompt again: its own end-of-prompt checkpoint
        other = len(m.tokenize(" a different question entirely", add_special=False))
        assert counts[2] == len(first) + other - 1
        # 4. a divergence before any checkpoint: decoded from the start, still the same tokens
        assert counts[3] == 0
        check_lossless(m, make, first, n, temperature=0.8, seed=7)  # seeded sampling too


@pytest.mark.fixture
def test_plain_generation_on_a_hybrid_model(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m:
        first = m.tokenize("hello " * 20)
        counts = check_lossless(m, lambda: llamaspec.Generator(m, n_ctx=512, n_threads=1), first,
                                temperature=0)
        # as with MTP: on a recurrent model a plain call's last prompt token gets its own pass, so
        # that its checkpoint before that token serves the same prompt again
        other = len(m.tokenize(" a different question entirely", add_special=False))
        assert counts == [len(first) + 24 - 1, len(first) - 1, len(first) + other - 1, 0]


@pytest.mark.fixture
@pytest.mark.parametrize("kind", ["draft", "eagle3", "dflash", "ngram-mod"])
def test_every_drafter_is_lossless_with_the_cache(fixture_dir: Path, fx_nomtp_info: FixtureInfo,
                                                  kind: str) -> None:
    writers = {"draft": write_draft_fixture, "eagle3": write_eagle3_fixture, "dflash": write_dflash_fixture}
    with llamaspec.Model(fx_nomtp_info.path) as m:
        first = m.tokenize(m.detokenize(fx_nomtp_info.cycle[10:40]), add_special=False)
        dm = None
        if kind in writers:
            info = writers[kind](fixture_dir / f"cache-{kind}.gguf", fx_nomtp_info, wrong_fraction=0.3)
            dm = llamaspec.Model(info.path)
        try:
            ngram = {"size_n": 3, "n_match": 4}
            opts: dict[str, Any] = {"ngram_options": ngram} if kind == "ngram-mod" else {}

            def make() -> Session:
                return Speculative(m, method=kind, draft_model=dm, n_draft=3, n_ctx=512, n_threads=1, **opts)

            counts = check_lossless(m, make, first, temperature=0)
            assert counts[0] == len(first) + 24 - 1
        finally:
            if dm is not None:
                dm.close()


@pytest.mark.real_model
def test_attention_only_model_cuts_the_cache_anywhere(smol: llamaspec.Model) -> None:
    # SmolLM2's CPU kernels round differently for batches of 32 rows and more (docs/adr/0018), so
    # the exact comparison runs with micro-batches of 16 rows, where a split changes nothing
    first = smol.tokenize("The quick brown fox jumps over the lazy dog. Then it")
    for cls, kw in ((llamaspec.Generator, {}), (Speculative, {"method": "draft", "draft_model": smol})):
        def make() -> Session:
            return cls(smol, n_ctx=512, n_batch=16, n_ubatch=16, n_threads=2, **kw)

        counts = check_lossless(smol, make, first, temperature=0)
        check_lossless(smol, make, first, temperature=0.7, seed=3)
        other = len(smol.tokenize(" a different question entirely", add_special=False))
        assert counts[0] == len(first) + 24 - 1
        assert counts[1] == len(first)  # no checkpoints needed: cut where they differ
        assert counts[2] == len(first) + other - 1
        assert counts[3] >= len(first) // 2


@pytest.mark.fixture
def test_cancel_in_the_middle_of_a_prompt_then_reuse(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m:
        prompt = m.tokenize("abcdefgh" * 400)
        for make in (lambda: MTP(m, n_draft=3, n_ctx=4096, n_threads=1, n_batch=64, n_ubatch=64),
                     lambda: llamaspec.Generator(m, n_ctx=4096, n_threads=1, n_batch=64, n_ubatch=64)):
            with make() as s:
                want, _ = call(s, prompt, 20, temperature=0, cache_prompt=False)
                for delay in (0.0, 0.01, 0.05):
                    seen: list[PromptProgress] = []
                    events = s.stream_events(prompt, 20, temperature=0, prompt_progress=True,
                                             cache_prompt=False)
                    for ev in events:
                        if isinstance(ev, PromptProgress):
                            seen.append(ev)
                            if ev.processed > 0:
                                time.sleep(delay)
                                break
                    events.close()  # type: ignore[attr-defined]
                    got, st = call(s, prompt, 20, temperature=0)
                    assert got == want, (delay, st.cached_tokens)
                got, st = call(s, prompt, 20, temperature=0)
                assert got == want and st.cached_tokens == len(prompt) - 1


@pytest.mark.fixture
def test_several_sequences_a_call_goes_where_its_prefix_is(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m:
        a, b = m.tokenize("hello " * 10), m.tokenize("ab " * 10)
        with llamaspec.Generator(m, n_seq=2, n_ctx=512, n_threads=1) as g:
            _, st_a = call(g, a, 8, temperature=0)
            _, st_b = call(g, b, 8, temperature=0)
            assert st_a.seq != st_b.seq  # the second call kept the first one's sequence
            # (the checkpoints of a hybrid model are before each prompt's last token)
            _, st = call(g, b + a, 8, temperature=0)
            assert st.seq == st_b.seq and st.cached_tokens == len(b) - 1
            _, st = call(g, a + b, 8, temperature=0)
            assert st.seq == st_a.seq and st.cached_tokens == len(a) - 1
            assert [c.checkpoints for c in g.prompt_cache()] == [2, 2]


@pytest.mark.fixture
def test_a_direct_call_on_the_context_empties_the_cache(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m:
        prompt = m.tokenize("hello " * 10)
        with llamaspec.Generator(m, n_ctx=512, n_threads=1) as g:
            want, _ = call(g, prompt, 8, temperature=0)
            g.context.decode(m.tokenize("ab ab"), 0)
            got, st = call(g, prompt, 8, temperature=0)
            assert got == want and st.cached_tokens == 0
            got, st = call(g, prompt, 8, temperature=0)
            assert got == want and st.cached_tokens == len(prompt) - 1


@pytest.mark.fixture
def test_cache_prompt_is_checked_and_false_decodes_everything(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m, llamaspec.Generator(m, n_ctx=256, n_threads=1) as g:
        g.generate("hello hello", 4)
        for bad in (1, "yes", None):
            with pytest.raises(InvalidOptionError, match="cache_prompt"):
                g.generate("hello hello", 4, cache_prompt=bad)
        _, st = call(g, m.tokenize("hello hello"), 4, cache_prompt=False)
        assert st.cached_tokens == 0


@pytest.mark.fixture
def test_threads_see_cached_tokens_in_stats(fx_nomtp_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_nomtp_info.path) as m, llamaspec.Generator(m, n_ctx=256, n_threads=1) as g:
        prompt = m.tokenize("hello " * 10)
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.append(g.stats().cached_tokens))
        call(g, prompt, 4)
        call(g, prompt, 4)
        reader.start()
        reader.join()
        assert seen == [len(prompt) - 1]
        (info,) = g.prompt_cache()
        assert info.tokens == len(prompt) + 3 and info.checkpoints == 1 and info.checkpoint_bytes > 0
