"""Several sequences in one speculative session (n_seq): outputs and per-call acceptance equal to each
call alone, shared passes, per-sequence and total stats, BusyError, cancelling one sequence."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

import llamaspec
from llamaspec import MTP, BusyError, ContextOverflowError, Done, InvalidOptionError, Speculative
from llamaspec_fixtures import FixtureInfo

from .conftest import proc_threads, settled_threads, token_ids

Call = tuple[str, dict[str, Any]]  # (prompt, sampling)


def mixed_calls(info: FixtureInfo, model: llamaspec.Model) -> list[Call]:
    """Four calls whose acceptance differs: greedy on and off the fixture's cycle, and seeded
    sampling at two temperatures (a sampled token is accepted only when it is the drafted one)."""
    return [
        ("hello", {"temperature": 0}),
        (model.detokenize(info.cycle[3:9]), {"temperature": 0}),
        ("ab", {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 11}),
        ("xyz", {"temperature": 4.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 12}),
    ]


def run_call(session: Speculative, call: Call, max_tokens: int) -> tuple[list[int], llamaspec.GenerationStats]:
    prompt, sampling = call
    events = list(session.stream_events(prompt, max_tokens, **sampling))
    done = events[-1]
    assert isinstance(done, Done)
    return token_ids(events), done.stats


def run_concurrently(session: Speculative, calls: Sequence[Call], max_tokens: int) \
        -> list[tuple[list[int], llamaspec.GenerationStats]]:
    """Each call in its own thread, started together."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(calls))

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = run_call(session, calls[i], max_tokens)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def figures(st: llamaspec.GenerationStats) -> tuple[int, int, int, int]:
    return st.tokens, st.iterations, st.drafts_generated, st.drafts_accepted


@pytest.mark.fixture
@pytest.mark.parametrize("n_seq", [1, 2, 4])
def test_each_call_is_what_it_is_alone(fx_mtp_levels: dict[str, FixtureInfo], n_seq: int) -> None:
    """Greedy and seeded sampling at mixed acceptance levels in one batch: every call's tokens and
    its (iterations, drafted, accepted) equal what the call gives on a session of its own."""
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m:
        calls = mixed_calls(info, m)
        with MTP(m, n_draft=3, n_ctx=1024, n_threads=1) as one:
            alone = [run_call(one, c, 300) for c in calls]
        rates = [st.acceptance_rate for _, st in alone]
        assert max(rates) - min(rates) > 0.3, rates  # the batch really mixes acceptance levels
        with MTP(m, n_draft=3, n_ctx=1024, n_threads=1, n_seq=n_seq) as multi:
            assert multi.n_seq == n_seq and multi.n_ctx == 1024
            got = run_concurrently(multi, calls[:n_seq], 300) if n_seq > 1 else [run_call(multi, calls[0], 300)]
            for (ids, st), (want_ids, want_st) in zip(got, alone):
                assert ids == want_ids
                assert figures(st) == figures(want_st)
            assert sorted(st.seq for _, st in got) == list(range(n_seq))
            total = multi.stats()
            per_seq = [multi.stats(seq=i) for i in range(n_seq)]
            for field in ("iterations", "drafts_generated", "drafts_accepted", "tokens_emitted"):
                assert getattr(total, field) == sum(getattr(s, field) for s in per_seq), field
            for ids_st in got:
                st = ids_st[1]
                assert per_seq[st.seq].iterations == st.iterations == per_seq[st.seq].passes
            if n_seq == 1:
                assert total.passes == total.iterations
            else:  # the sequences shared the target's passes
                assert total.passes < total.iterations
            assert not multi.busy and multi.n_running == 0


@pytest.mark.fixture
@pytest.mark.parametrize("method", ["draft", "eagle3", "dspark", "dflash", "ngram-mod"])
def test_other_drafters_batch_losslessly(fx_nomtp_info: FixtureInfo, fixture_dir: Any, method: str) -> None:
    """Draft models and drafter heads draft for all sequences in one call; n-gram methods per
    sequence. Greedy outputs equal the calls alone; for the model drafters, so do the counts."""
    from llamaspec_fixtures import write_dflash_fixture, write_draft_fixture, write_dspark_fixture, write_eagle3_fixture

    kw: dict[str, Any] = {"method": method}
    if method == "draft":
        kw["draft_model"] = write_draft_fixture(fixture_dir / "ms-draft.gguf", fx_nomtp_info, wrong_fraction=0.3).path
    elif method == "dspark":
        kw["draft_model"] = write_dspark_fixture(fixture_dir / "ms-dspark.gguf", fx_nomtp_info, wrong_fraction=0.3).path
    elif method == "eagle3":  # with several sequences its drafts are sampled on the CPU (ADR 0012)
        kw["draft_model"] = write_eagle3_fixture(fixture_dir / "ms-eagle3.gguf", fx_nomtp_info, wrong_fraction=0.3).path
    elif method == "dflash":
        kw["draft_model"] = write_dflash_fixture(fixture_dir / "ms-dflash.gguf", fx_nomtp_info, wrong_fraction=0.3).path
    else:
        kw["ngram_options"] = {"n_match": 4}
    with llamaspec.Model(fx_nomtp_info.path) as m:
        prompts = ["hello", "ab", m.detokenize(fx_nomtp_info.cycle[3:9]), "xyz"]
        with Speculative(m, n_draft=3, n_ctx=512, n_threads=1, **kw) as one:
            alone = [run_call(one, (p, {"temperature": 0}), 120) for p in prompts]
        with Speculative(m, n_draft=3, n_ctx=512, n_threads=1, n_seq=4, **kw) as multi:
            texts = multi.generate_batch(prompts, 120, temperature=0)
            assert texts == [m.detokenize(ids) for ids, _ in alone]
            if method != "ngram-mod":  # ngram-mod's table is shared: concurrent texts teach it differently
                for i in range(4):  # each sequence served one call: its counts are that call's alone
                    st_i = multi.stats(seq=i)
                    assert (st_i.iterations, st_i.drafts_generated, st_i.drafts_accepted) in \
                        [(st.iterations, st.drafts_generated, st.drafts_accepted) for _, st in alone]
                assert multi.stats().drafts_accepted == sum(st.drafts_accepted for _, st in alone)
            assert multi.stats().passes < multi.stats().iterations


@pytest.mark.fixture
def test_generate_batch_takes_more_prompts_than_sequences(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["100"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=4, n_ctx=512, n_threads=1) as one, \
            MTP(m, n_draft=4, n_ctx=512, n_threads=1, n_seq=2) as multi:
        prompts: list[str | list[int]] = ["hello", "ab", "xyz", m.detokenize(info.cycle[:5]), [1, 2, 3]]
        want = [one.generate(p, 50, temperature=0) for p in prompts]
        assert multi.generate_batch(prompts, 50, temperature=0) == want
        assert multi.generate_batch([], 50) == []
        with pytest.raises(InvalidOptionError, match="sequence of prompts"):
            multi.generate_batch("hello")
        with pytest.raises(InvalidOptionError, match="max_tokens"):
            multi.generate_batch(["a", "b"], 0)


@pytest.mark.fixture
def test_one_more_call_than_sequences_is_busy(fx: llamaspec.Model) -> None:
    with MTP(fx, n_draft=3, n_ctx=512, n_threads=1, n_seq=2) as multi:
        a = multi.stream_events("hello", 400, temperature=0)
        b = multi.stream_events("ab", 400, temperature=0)
        next(a), next(b)  # both calls are running
        assert multi.busy and multi.n_running == 2
        with pytest.raises(BusyError, match="n_seq=2"):
            next(multi.stream_events("xyz", 10))
        a.close()  # type: ignore[attr-defined]  # frees its sequence at once
        assert multi.n_running == 1
        assert multi.generate("xyz", 5, temperature=0)
        b.close()  # type: ignore[attr-defined]
        assert not multi.busy and multi.n_running == 0


@pytest.mark.fixture
def test_cancelling_one_sequence_leaves_the_others_running(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m:
        with MTP(m, n_draft=3, n_ctx=1024, n_threads=1) as one:
            want = {p: one.generate(p, 300, temperature=0) for p in ("hello", "ab")}
        threads_before = proc_threads()
        with MTP(m, n_draft=3, n_ctx=1024, n_threads=1, n_seq=3) as multi:
            for _ in range(3):
                got: dict[str, str] = {}
                seen: list[int] = []
                barrier = threading.Barrier(3)

                def full(p: str) -> None:
                    barrier.wait()
                    got[p] = multi.generate(p, 300, temperature=0)

                def early() -> None:
                    barrier.wait()
                    n = 0
                    for _piece in multi.stream("xyz", 300, temperature=0):
                        n += 1
                        if n == 3:
                            break  # leaving the loop cancels this call, and only this one
                    seen.append(n)

                multi.reset_stats()
                ts = [threading.Thread(target=full, args=(p,)) for p in want] + [threading.Thread(target=early)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                assert got == want and seen == [3]
                assert not multi.busy
                assert 600 <= multi.stats().tokens_emitted < 900
            assert multi.generate("hello", 300, temperature=0) == want["hello"]
        assert settled_threads(threads_before) <= threads_before


@pytest.mark.fixture
def test_async_streams_share_the_session(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m:
        prompts = ["hello", "ab", m.detokenize(info.cycle[3:9])]
        with MTP(m, n_draft=3, n_ctx=512, n_threads=1) as one:
            want = [one.generate(p, 150, temperature=0) for p in prompts]
        with MTP(m, n_draft=3, n_ctx=512, n_threads=1, n_seq=3) as multi:
            async def one_stream(p: str) -> str:
                return "".join([piece async for piece in multi.astream(p, 150, temperature=0)])

            async def main() -> list[str]:
                return list(await asyncio.gather(*(one_stream(p) for p in prompts)))

            assert asyncio.run(main()) == want
            assert multi.stats().passes < multi.stats().iterations


@pytest.mark.fixture
def test_multi_sequence_options_are_checked(fx: llamaspec.Model) -> None:
    for bad in (0, 65, "2", True):
        with pytest.raises(InvalidOptionError, match="n_seq"):
            MTP(fx, n_seq=bad)
    with pytest.raises(InvalidOptionError, match="n_batch"):
        MTP(fx, n_draft=3, n_seq=4, n_batch=8, n_ubatch=8)
    with MTP(fx, n_draft=3, n_ctx=256, n_threads=1, n_seq=2) as multi:
        assert multi.n_ctx == 256  # per sequence
        with pytest.raises(ContextOverflowError, match="n_ctx=256"):
            multi.generate("hello", 300)
        for bad_seq in (-1, 2, "0"):
            with pytest.raises(InvalidOptionError, match="seq"):
                multi.stats(seq=bad_seq)  # type: ignore[arg-type]


@pytest.mark.real_model
def test_smollm2_batches_keep_their_acceptance(smol: llamaspec.Model) -> None:
    """SmolLM2 drafting for itself, two sequences: each call's output equals plain greedy (or
    diverges only at a near-tie, as in test_speculative) and its acceptance is within 2 points of
    the same call alone."""
    prompts = ["Here is a list of fruits: apple, banana, cherry. Repeat the list three times:",
               "The capital of France is", "def fibonacci(n):", "Once upon a time"]
    kw: dict[str, Any] = {"method": "draft", "draft_model": smol, "n_draft": 4, "n_ctx": 512, "n_threads": 1}
    with Speculative(smol, **kw) as one:
        alone = [run_call(one, (p, {"temperature": 0}), 60) for p in prompts]
    with Speculative(smol, n_seq=2, **kw) as multi:
        got = run_concurrently(multi, [(p, {"temperature": 0}) for p in prompts[:2]], 60) \
            + run_concurrently(multi, [(p, {"temperature": 0}) for p in prompts[2:]], 60)
        for (ids, st), (want_ids, want_st) in zip(got, alone):
            assert abs(st.acceptance_rate - want_st.acceptance_rate) <= 0.02, (st, want_st)
            assert ids == want_ids
        assert multi.stats().passes < multi.stats().iterations


@pytest.mark.fixture
def test_stats_events_follow_the_calls_sequence(fx_mtp_levels: dict[str, FixtureInfo]) -> None:
    """With n_seq > 1, the Stats events of a stream carry its own sequence's counters."""
    from llamaspec import Stats

    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=1024, n_threads=1, n_seq=2) as multi:
        snaps: dict[str, list[Any]] = {"hello": [], "ab": []}
        barrier = threading.Barrier(2)

        def work(p: str) -> None:
            barrier.wait()
            for ev in multi.stream_events(p, 300, temperature=0, emit_stats_every=20):
                if isinstance(ev, Stats):
                    snaps[p].append(ev.snapshot)

        ts = [threading.Thread(target=work, args=(p,)) for p in snaps]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for got in snaps.values():
            assert len(got) == 15
            # a sequence's own counters: every verify it was in is one of its passes
            assert all(s.iterations == s.passes and s.tokens_emitted <= 300 for s in got)
        total = multi.stats()
        assert total.passes < total.iterations


@pytest.mark.fixture
def test_a_task_cancelled_while_its_call_starts_leaves_nothing_running(fx: llamaspec.Model) -> None:
    import contextlib
    import time

    with MTP(fx, n_draft=3, n_ctx=1024, n_threads=1, n_seq=2) as multi:
        async def consume() -> None:
            async for _ in multi.astream("hello", 800, temperature=0):
                pass

        async def main() -> None:
            for _ in range(20):
                task = asyncio.create_task(consume())
                await asyncio.sleep(0)  # the start is on its way in the executor
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        asyncio.run(main())
        deadline = time.monotonic() + 10
        while multi.n_running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert multi.n_running == 0 and not multi.busy
        assert multi.generate("hello", 5, temperature=0)
