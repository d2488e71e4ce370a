"""Cancellation, reuse, timeouts, concurrency, async: the native loop always stops and the object is
reusable at once."""

from __future__ import annotations

import _thread
import asyncio
import gc
import signal
import threading
import time
from collections.abc import Iterator

import pytest

import llamaspec
from llamaspec import BusyError, Done, Token

from .conftest import Ticker, proc_threads, settled_threads



@pytest.mark.fixture
def test_break_after_three_tokens_200_times(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        reference = g.generate("abc", 20, temperature=0)
        threads_before = proc_threads()
        for i in range(200):
            got = []
            for piece in g.stream("abc", 200, temperature=0):
                got.append(piece)
                if len(got) == 3:
                    break
            assert "".join(got) == reference[:3]
            assert not g.busy
            if i % 50 == 0:
                assert g.generate("abc", 20, temperature=0) == reference
        assert g.generate("abc", 20, temperature=0) == reference
        assert settled_threads(threads_before) <= threads_before  # no leaked native worker


@pytest.mark.fixture
def test_abandoned_iterator_is_closed_by_gc(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        it = g.stream("abc", 200, temperature=0)
        next(it)
        assert g.busy
        del it
        gc.collect()
        assert not g.busy
        assert g.generate("abc", 5, temperature=0)


@pytest.mark.real_model
def test_cancel_during_long_prompt(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol, n_ctx=2048) as g:
        prompt = smol.tokenize("word " * 1800)
        t0 = time.perf_counter()
        list(g.stream_events(prompt, 2, temperature=0, cache_prompt=False))
        full_prefill = time.perf_counter() - t0

        timer = threading.Timer(full_prefill / 10, g.cancel)
        t0 = time.perf_counter()
        timer.start()
        events = list(g.stream_events(prompt, 2, temperature=0, cache_prompt=False))
        elapsed = time.perf_counter() - t0
        timer.join()
        assert isinstance(events[-1], Done) and events[-1].stats.finish_reason == "cancelled"
        assert not any(isinstance(e, Token) for e in events)
        assert elapsed < full_prefill * 0.6, (elapsed, full_prefill)  # stopped inside the prompt
        assert "Paris" in g.generate("The capital of France is", 8, temperature=0)  # reusable at once


@pytest.fixture
def python_sigint_handler() -> Iterator[None]:
    """Python's own Ctrl-C handler for the test, also when the process started with SIGINT ignored
    (a background job of a non-interactive shell), where interrupt_main() does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.real_model
@pytest.mark.usefixtures("python_sigint_handler")
def test_ctrl_c_during_blocking_generate(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol, n_ctx=2048) as g:
        prompt = smol.tokenize("word " * 1800)
        timer = threading.Timer(0.05, _thread.interrupt_main)
        timer.start()
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            g.generate(prompt, 200, temperature=0)
        timer.join()
        assert time.perf_counter() - t0 < 1.0
        assert not g.busy
        assert "Paris" in g.generate("The capital of France is", 8, temperature=0)


@pytest.mark.fixture
def test_concurrent_calls_on_one_generator_raise_busy(fx: llamaspec.Model) -> None:
    results: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    with llamaspec.Generator(fx, n_ctx=512, n_threads=1) as g:
        def worker() -> None:
            start.wait()
            try:
                results.append(g.generate("abc", 300, temperature=0))
            except BusyError as e:
                errors.append(e)

        ts = [threading.Thread(target=worker) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert len(results) >= 1 and len(results) + len(errors) == 4
    assert len(set(results)) == 1


@pytest.mark.real_model
def test_shared_model_two_threads_two_generators(smol: llamaspec.Model) -> None:
    prompts = ["The capital of France is", "My favourite fruit is"]
    with llamaspec.Generator(smol, n_threads=1) as g:
        expected = [g.generate(p, 32, temperature=0) for p in prompts]
    out: dict[int, list[str]] = {0: [], 1: []}

    def worker(i: int) -> None:
        with llamaspec.Generator(smol, n_threads=1) as g:
            for _ in range(3):
                out[i].append(g.generate(prompts[i], 32, temperature=0))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out[0] == [expected[0]] * 3 and out[1] == [expected[1]] * 3


@pytest.mark.fixture
def test_async_stream_matches_sync(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        expected = g.generate("async", 30, temperature=0)

        async def main() -> tuple[str, list[object]]:
            text = "".join([p async for p in g.astream("async", 30, temperature=0)])
            events = [e async for e in g.astream_events("async", 30, temperature=0)]
            return text, events

        text, events = asyncio.run(main())
    assert text == expected
    assert isinstance(events[-1], Done) and events[-1].stats.tokens == 30


@pytest.mark.fixture
def test_async_does_not_block_the_event_loop_and_cancels(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=8192, n_threads=1) as g:
        async def main() -> tuple[int, int]:
            ticks = 0
            received = 0
            started = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1

            async def consume() -> None:
                nonlocal received
                async for _ in g.astream("abc", 8000, temperature=0):
                    received += 1
                    if received == 20:
                        started.set()

            t = asyncio.create_task(ticker())
            task = asyncio.create_task(consume())
            await asyncio.wait_for(started.wait(), 30)
            ticks_at_start = ticks
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t.cancel()
            return ticks - ticks_at_start, received

        ticks, received = asyncio.run(main())
        assert ticks >= 5  # the loop kept running while tokens streamed
        assert 20 <= received < 8000  # cancelled mid-stream
        assert not g.busy
        assert len(g.generate("abc", 10, temperature=0)) == 10


@pytest.mark.fixture
def test_close_while_streaming_in_another_thread(fx: llamaspec.Model) -> None:
    g = llamaspec.Generator(fx, n_ctx=8192, n_threads=1)
    got: list[object] = []

    def consume() -> None:
        got.extend(g.stream_events("abc", 8000, temperature=0))

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.05)
    g.close()
    t.join(10)
    assert not t.is_alive()
    assert isinstance(got[-1], Done) and got[-1].stats.finish_reason == "cancelled"


@pytest.mark.real_model
def test_loading_and_generating_release_the_gil(smol_path: str) -> None:
    with Ticker() as ticker:
        t0 = time.perf_counter()
        with llamaspec.Model(smol_path, use_mmap=False) as m:  # read the whole file: a long native call
            load_s = time.perf_counter() - t0
            ticks_after_load = ticker.ticks
            with llamaspec.Generator(m, n_threads=1) as g:
                g.generate("word " * 400, 4, temperature=0)
    # the ticker ran during the load (it would be frozen if the GIL were held)
    assert ticks_after_load > load_s * 1000 * 0.2, (ticks_after_load, load_s)
    assert ticker.ticks > ticks_after_load
