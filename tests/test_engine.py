"""One engine for every generation: plain Generator sessions of several sequences, and the hazards a
review of the engine found (each test here failed before its fix)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import llamaspec
from llamaspec import MTP, Generator, Token
from llamaspec.errors import BusyError, ClosedError, DecodeError, InvalidOptionError, LlamaspecError

from .conftest import Ticker, token_ids

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea:",
    "List three colours:",
    "Once upon a time, in a small village,",
]


# -- one engine: plain sessions of several sequences ------------------------------------------------

@pytest.mark.real_model
@pytest.mark.parametrize("n_seq", [2, 4])
def test_plain_calls_together_are_what_they_are_alone(smol: llamaspec.Model, n_seq: int) -> None:
    """Greedy and seeded calls sharing target passes give, token for token, what each gives alone."""
    samplings: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 0.9, "seed": 7}]
    with Generator(smol, n_ctx=256, n_threads=2) as alone:
        expected = [[token_ids(alone.stream_events(p, 40, **s)) for p in PROMPTS[:n_seq]] for s in samplings]
    with Generator(smol, n_ctx=256, n_threads=2, n_seq=n_seq) as gen:
        for s, want in zip(samplings, expected):
            barrier = threading.Barrier(n_seq)

            def one(p: str, s: dict[str, Any] = s, barrier: threading.Barrier = barrier) -> list[int]:
                barrier.wait()
                return token_ids(gen.stream_events(p, 40, **s))

            with ThreadPoolExecutor(n_seq) as pool:
                got = list(pool.map(one, PROMPTS[:n_seq]))
            assert got == want
        stats = gen.stats()
        assert stats.passes < stats.iterations  # the calls did share passes
        assert stats.drafts_generated == 0 and stats.n_draft == 0 and stats.stages == ()
        assert gen.generate_batch(PROMPTS, 24, temperature=0) == [
            Generator(smol, n_ctx=256).generate(p, 24, temperature=0) for p in PROMPTS]


@pytest.mark.real_model
def test_plain_session_is_busy_only_when_every_sequence_is_taken(smol: llamaspec.Model) -> None:
    with Generator(smol, n_ctx=128, n_seq=2) as gen:
        a = gen.stream_events("one", 64, temperature=0)
        b = gen.stream_events("two", 64, temperature=0)
        next(a)
        assert not gen.busy and gen.n_running == 1
        next(b)
        assert gen.busy and gen.n_running == 2
        with pytest.raises(BusyError, match="n_seq=2"):
            next(gen.stream_events("three", 8))
        a.close()
        assert not gen.busy
        assert isinstance(next(gen.stream_events("three", 8, temperature=0)), Token)
        b.close()


@pytest.mark.real_model
def test_session_options_the_session_sets_itself_are_refused(smol: llamaspec.Model) -> None:
    for name, value in (("n_seq_max", 2), ("kv_unified", True)):
        with pytest.raises(InvalidOptionError, match=f"{name} is set by the session.*n_seq"):
            Generator(smol, **{name: value})
    with pytest.raises(InvalidOptionError, match="n_seq"):
        Generator(smol, n_seq=0)
    with pytest.raises(InvalidOptionError, match=r"n_batch \(2\) must hold one token of every sequence"):
        Generator(smol, n_seq=4, n_batch=2, n_ubatch=2)
    with llamaspec.Context(smol, n_ctx=64, n_seq_max=2) as ctx:  # the low-level Context keeps them
        assert ctx.n_seq_max == 2


@pytest.mark.real_model
def test_a_bare_context_reserves_a_row_per_sequence(smol: llamaspec.Model) -> None:
    """A Context reserves n_seq_max output rows (ADR 0033), more than n_batch here: llama.cpp wants
    one per sequence, and a decode in several batches still gives the last token's logits."""
    ids = smol.tokenize("The capital of France is")
    with llamaspec.Context(smol, n_ctx=64) as ref, \
            llamaspec.Context(smol, n_ctx=64, n_seq_max=4, n_batch=2, n_ubatch=2) as ctx:
        ref.decode(ids)
        ctx.decode(ids)
        a, b = ref.logits(), ctx.logits()
        assert b.shape == a.shape and np.isfinite(b).all()
        assert int(b.argmax()) == int(a.argmax())
        ctx.decode([int(b.argmax())], len(ids))  # one more token, one more row
        assert np.isfinite(ctx.logits()).all()


# -- hazards ------------------------------------------------------------------------------------------

@pytest.mark.real_model
def test_a_stale_cancel_does_not_reach_the_next_call(smol: llamaspec.Model) -> None:
    """A cancel of a call that has ended (a handle kept, or _StreamingSession.cancel racing with the
    end of a call) must not abort a later call: cancellation is per call, not a context flag."""
    with Generator(smol, n_ctx=256) as gen:
        runs: list[Any] = []
        first = gen._iterate(gen._prepare("Hello", 4, None, None, {"temperature": 0}), runs.append)
        assert list(first)[-1].stats.finish_reason == "length"
        stale = runs[0]
        events = gen.stream_events("The capital of France is", 40, temperature=0)
        next(events)
        stale.cancel()  # before the fix: set the shared abort flag, the next decode returned 2
        done = list(events)[-1]
        assert done.stats.finish_reason == "length" and done.stats.tokens == 40


@pytest.mark.real_model
def test_the_sessions_context_is_refused_while_it_generates(smol: llamaspec.Model) -> None:
    """session.context is the engine's own context: a direct decode in the middle of a stream would
    put two threads into llama_decode on it."""
    with Generator(smol, n_ctx=256) as gen:
        events = gen.stream_events("The capital of France is", 32, temperature=0)
        next(events)
        for call in (lambda: gen.context.decode([1, 2, 3]), gen.context.clear, gen.context.logits):
            with pytest.raises(BusyError, match="in use"):
                call()
        rest = list(events)
        assert rest[-1].stats.finish_reason == "length"
        gen.context.decode([1, 2, 3])  # idle: it is the caller's again
        assert gen.context.logits().shape == (smol.n_vocab,)
        assert gen.generate("Hi", 4, temperature=0)  # and the next call starts from a clean cache


@pytest.mark.fixture
def test_a_failed_rollback_ends_the_call_with_decode_error(fx_mtp_levels: dict[str, Any], armed_fault: Any) -> None:
    """llama_memory_seq_rm's result was ignored: a rollback that fails must raise DecodeError, and
    every token emitted before it is still the right one."""
    info = fx_mtp_levels["74"]
    with llamaspec.Model(info.path) as m, MTP(m, n_draft=3, n_ctx=512) as mtp:
        prompt = m.detokenize(info.cycle[:8])
        want = token_ids(mtp.stream_events(prompt, 64, temperature=0))
        armed_fault("seq_rm_fails", 6)  # the prompt's clear, then the rollbacks of the verifies
        got: list[int] = []
        with pytest.raises(DecodeError, match="rollback failed"):
            for ev in mtp.stream_events(prompt, 64, temperature=0):
                if isinstance(ev, Token):
                    got.append(ev.id)
        assert 0 < len(got) < 64 and got == want[:len(got)]
        assert token_ids(mtp.stream_events(prompt, 64, temperature=0)) == want  # the session goes on


@pytest.mark.real_model
def test_an_unknown_exception_on_the_engine_thread_is_a_typed_error(smol: llamaspec.Model, armed_fault: Any) -> None:
    """The engine thread caught only std::exception: anything else ended the process."""
    with Generator(smol, n_ctx=256, n_seq=2) as gen:
        armed_fault("throw_unknown", 3)
        with pytest.raises(LlamaspecError, match="unknown type"):
            gen.generate("The capital of France is", 32, temperature=0)
        assert gen.n_running == 0 and not gen.busy
        assert gen.generate("The capital of France is", 8, temperature=0)


@pytest.mark.real_model
def test_tokenizing_works_for_as_long_as_a_session_holds_the_model(smol_path: str) -> None:
    """Model.close() drops the Model's handle; a live session keeps the weights and must go on
    taking text prompts and chats (it raised ClosedError while token ids still worked)."""
    model = llamaspec.Model(smol_path)
    chat = [{"role": "user", "content": "Hi"}]
    with Generator(model, n_ctx=256) as gen:
        want = gen.generate("The capital of France is", 8, temperature=0)
        want_chat = gen.generate(messages=chat, max_tokens=8, temperature=0)
        model.close()
        with pytest.raises(ClosedError):
            model.tokenize("x")
        assert gen.generate("The capital of France is", 8, temperature=0) == want
        assert gen.generate(messages=chat, max_tokens=8, temperature=0) == want_chat
        assert gen.chat(chat, 8, temperature=0).content == want_chat


@pytest.mark.real_model
def test_freeing_a_session_releases_the_gil(smol: llamaspec.Model, armed_fault: Any) -> None:
    """The last reference to a session frees its llama_context; that free ran with the GIL held, so
    every other Python thread stood still. A free made slow (500 ms) must let another thread run."""
    gen = Generator(smol, n_ctx=256)
    gen.generate("Hi", 2, temperature=0)
    with Ticker() as ticker:
        time.sleep(0.05)
        armed_fault("slow_free_ms", 500)
        before = ticker.ticks
        gen.close()
        del gen
        gc.collect()  # the context's destructor runs here, on this thread
        during = ticker.ticks - before
    assert during >= 20  # with the GIL held through the free: 0 or 1


class _CountingExecutor(ThreadPoolExecutor):
    submissions = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        type(self).submissions += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.real_model
def test_async_streams_take_no_executor_hop_per_event(smol: llamaspec.Model) -> None:
    """An async stream waited for every event in the loop's default executor (shared with the
    application): the engine now wakes the loop through a pipe; only a call's start and close use
    the executor."""
    n_streams, n_tokens = 32, 24

    async def main(gen: Generator) -> list[list[int]]:
        loop = asyncio.get_running_loop()
        executor = _CountingExecutor(max_workers=8)
        loop.set_default_executor(executor)

        async def one(i: int) -> list[int]:
            return [ev.id async for ev in gen.astream_events(PROMPTS[i % 4], n_tokens, temperature=0)
                    if isinstance(ev, Token)]

        try:
            return await asyncio.gather(*(one(i) for i in range(n_streams)))
        finally:
            executor.shutdown(wait=True)

    _CountingExecutor.submissions = 0
    with Generator(smol, n_ctx=128, n_seq=n_streams) as gen:
        got = asyncio.run(main(gen))
        want = [token_ids(gen.stream_events(p, n_tokens, temperature=0)) for p in PROMPTS]
    assert got == [want[i % 4] for i in range(n_streams)]
    events = sum(len(g) + 1 for g in got)
    assert _CountingExecutor.submissions <= 2 * n_streams < events  # start + close per stream


@pytest.mark.real_model
def test_async_timeouts_still_apply(smol: llamaspec.Model) -> None:
    async def main(gen: Generator) -> None:
        with pytest.raises(llamaspec.GenerationTimeout, match="prefill_timeout"):
            async for _ in gen.astream_events("x " * 400, 8, prefill_timeout=1e-4):
                pass

    with Generator(smol, n_ctx=1024, n_batch=8) as gen:
        asyncio.run(main(gen))
        assert gen.n_running == 0
        assert gen.generate("Hi", 4, temperature=0)


@pytest.mark.real_model
def test_every_native_counter_reaches_spec_stats(smol: llamaspec.Model) -> None:
    """The counters are listed once natively (stats.h); each one must be a SpecStats field or feed
    a derived one, so that a counter added there cannot be silently dropped here."""
    import dataclasses

    from llamaspec.stats import _NATIVE_INPUTS, SpecStats

    with Generator(smol, n_ctx=128) as gen:
        gen.generate("Hi", 4, temperature=0)
        raw = gen._require().stats(-1)
        fields = {f.name for f in dataclasses.fields(SpecStats)}
        assert set(raw) - fields - _NATIVE_INPUTS == set()
        st = gen.stats()
        # plain: the first token comes from the prompt pass, each other one from a pass of its own
        assert st.tokens_emitted == 4 and st.iterations == 3 and st.passes == 3
        assert st.timing_us["total"] > 0 and st.tokens_per_second > 0


@pytest.mark.real_model
def test_each_option_is_listed_once_per_side(smol: llamaspec.Model) -> None:
    """An option is one entry in the Python table (name, check, default) and one in the native
    table (name, setter): the two lists must name the same options, and the native side refuses a
    name it does not know instead of dropping it."""
    from llamaspec._options import CHAT_SAMPLING_FIELDS, CONTEXT_OPTIONS, SAMPLING_OPTIONS

    native = llamaspec._native
    assert sorted(native.context_option_names()) == sorted(CONTEXT_OPTIONS)
    # stop, grammar_root and the log-probability options are the call's own arguments, not the
    # sampler's; json_schema becomes grammar
    call_side = {"stop", "grammar_root", "json_schema", "logprobs", "top_logprobs", "post_sampling_probs"}
    python_side = set(SAMPLING_OPTIONS) - call_side | set(CHAT_SAMPLING_FIELDS)
    assert sorted(native.sampling_option_names()) == sorted(python_side)
    with Generator(smol, n_ctx=64) as gen:
        with pytest.raises(InvalidOptionError, match="unknown sampling option 'no_such'"):
            gen._require().start([1, 2], 4, [], {"no_such": 1}, "root")
        with pytest.raises(InvalidOptionError, match="unknown context option 'no_such'"):
            native.Context.create(smol._require(), {"no_such": 1})
        assert gen.generate("Hi", 2, temperature=0)  # nothing was left taken
