"""The streaming machinery every generation object shares (Generator now; speculative sessions later).

A subclass provides ``self._engine`` (a native engine whose ``start(...)`` returns a native Run) and
``self._model``. This class turns the Run's native events into Python events, applies the timeouts,
and makes every exit path (exhaustion, break, close(), garbage collection, Ctrl-C, an exception)
cancel and join the native worker, so that the session is reusable at once.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from . import _native
from ._log import sync_log_level
from ._options import sampling_options
from .errors import ClosedError, GenerationTimeout, InvalidOptionError
from .events import Done, EndOfGeneration, Event, GenerationStats, Token
from .context import Context
from .model import Model

_S = TypeVar("_S", bound="_StreamingSession")

Prompt = str | Sequence[int]


@dataclass(frozen=True)
class _Request:
    tokens: list[int]
    max_tokens: int
    timeout: float | None
    prefill_timeout: float | None
    stop: list[str]
    grammar_root: str
    sampling: dict[str, Any]


def _check_timeout(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InvalidOptionError(f"{name} must be a positive number of seconds or None, got {v!r}")
    return float(v)


class _Pull:
    """One call's wait policy and event conversion, shared by the sync and async iterators:
    ``prefill_timeout`` bounds the wait for the first token, ``timeout`` each one after it."""

    def __init__(self, session: _StreamingSession, run: _native.Run, req: _Request) -> None:
        self._session = session
        self._run = run
        self._req = req
        self._first = True

    @property
    def wait(self) -> float:
        """Seconds to wait for the next event (-1: no limit), for Run.next."""
        w = self._req.prefill_timeout if self._first else self._req.timeout
        return -1.0 if w is None else w

    def event(self, ev: tuple[Any, ...] | None) -> Event:
        """Convert what Run.next returned; None (nothing within the wait) stops the run and raises."""
        if ev is None:
            self._run.cancel()
            phase = "prompt phase, prefill_timeout" if self._first else "timeout"
            raise GenerationTimeout(f"no token within {self.wait} s ({phase}); the generation was stopped")
        event = self._session._convert(ev)
        if isinstance(event, Token):
            self._first = False
        return event


class _StreamingSession:
    _engine: _native.Generator | _native.SpecSession | None
    _model: Model
    _context: Context  # the context the session decodes on (the target, for speculative sessions)

    def _init_session(self) -> None:
        self._lock = threading.Lock()
        self._active: list[_native.Run] = []  # running calls (several on multi-sequence sessions)
        self._last_stats: GenerationStats | None = None
        self._closed = False

    # -- request preparation (eager: errors surface at the call, not at the first next()) ---------

    def _prepare(self, prompt: Prompt, max_tokens: int, timeout: float | None,
                 prefill_timeout: float | None, sampling: dict[str, Any]) -> _Request:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidOptionError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        opts = sampling_options(sampling)
        stop = opts.pop("stop", [])
        grammar_root = opts.pop("grammar_root", None) or "root"
        if isinstance(prompt, str):
            tokens = self._model.tokenize(prompt, add_special=True, parse_special=True)
        elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
            items: list[object] = list(prompt)
            tokens = []
            for t in items:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise InvalidOptionError(f"a token-id prompt must hold ints, not {type(t).__name__}")
                tokens.append(t)
        else:
            raise InvalidOptionError(f"prompt must be a str or a list of token ids, not {type(prompt).__name__}")
        if not tokens:
            raise InvalidOptionError("the prompt is empty")
        return _Request(tokens, max_tokens, _check_timeout("timeout", timeout),
                        _check_timeout("prefill_timeout", prefill_timeout), stop, grammar_root, opts)

    def _start(self, req: _Request) -> _native.Run:
        engine = self._engine
        if engine is None:
            raise ClosedError(f"this {type(self).__name__} is closed")
        sync_log_level()
        run = engine.start(req.tokens, req.max_tokens, req.stop, req.sampling, req.grammar_root)
        with self._lock:
            self._active.append(run)
        return run

    def _finish(self, run: _native.Run) -> None:
        run.close()
        with self._lock:
            if run in self._active:
                self._active.remove(run)

    def _convert(self, ev: tuple[Any, ...]) -> Event:
        kind = ev[0]
        if kind == 0:
            return Token(ev[1], ev[2])
        if kind == 1:
            return EndOfGeneration()
        stats = GenerationStats._from_native(ev[1])
        self._last_stats = stats
        return Done(stats)

    # -- sync iteration --------------------------------------------------------------------------

    def _iterate(self, req: _Request, on_start: Callable[[_native.Run], None] | None = None) -> Iterator[Event]:
        run = self._start(req)
        try:
            if on_start is not None:
                on_start(run)
            pull = _Pull(self, run, req)
            while True:
                event = pull.event(run.next(pull.wait))
                yield event
                if isinstance(event, Done):
                    return
        finally:
            self._finish(run)

    def stream_events(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
                      prefill_timeout: float | None = None, **sampling: Any) -> Iterator[Event]:
        """Generate, yielding Token events, then EndOfGeneration (if the model stopped), then Done.

        The decode loop runs in C++ with the GIL released. Leaving the loop early (break, close(),
        garbage collection, an exception, Ctrl-C) stops the native work within one step, also in the
        middle of a long prompt, and the object can generate again at once.

        Args:
            prompt: text (tokenized with BOS as the model wants and special tokens parsed) or token ids.
            max_tokens: exact upper bound on generated tokens (>= 1).
            timeout: seconds to wait for each token after the first (None: no limit).
            prefill_timeout: seconds to wait for the first token (None: no limit).
            **sampling: sampling options (README, "Sampling"); ``stop`` ends the text before the first
                stop string (which is not emitted).

        Returns:
            An iterator of events; the generation starts at the first ``next()``.

        Raises:
            InvalidOptionError: an invalid option or prompt (here, at the call).
            TypeError: an unknown option (here, at the call).
            ContextOverflowError: prompt + max_tokens > n_ctx (at the first ``next()``).
            BusyError: another generation is running on this object (at the first ``next()``).
            GrammarError: the grammar does not parse (at the first ``next()``).
            GenerationTimeout: a timeout passed; the native work was stopped.
        """
        return self._iterate(self._prepare(prompt, max_tokens, timeout, prefill_timeout, sampling))

    def stream(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
               prefill_timeout: float | None = None, **sampling: Any) -> Iterator[str]:
        """Generate, yielding text pieces as they are ready (see stream_events for arguments/errors).

        Returns:
            An iterator of non-empty str pieces whose concatenation is the generated text.
        """
        events = self.stream_events(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)
        return (ev.text for ev in events if isinstance(ev, Token) and ev.text)

    def generate(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
                 prefill_timeout: float | None = None, **sampling: Any) -> str:
        """Generate and return the whole text (see stream_events for arguments and errors).

        Ctrl-C while it blocks stops the native work and raises KeyboardInterrupt.

        Returns:
            The generated text; ``last_stats`` holds the call's figures.
        """
        events = self.stream_events(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)
        try:
            return "".join(ev.text for ev in events if isinstance(ev, Token))
        finally:
            events.close()  # type: ignore[attr-defined]

    # -- async iteration ---------------------------------------------------------------------------

    async def astream_events(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
                             prefill_timeout: float | None = None, **sampling: Any) -> AsyncIterator[Event]:
        """Async form of stream_events. Never blocks the event loop: every wait on the native queue
        runs in the loop's default executor. Cancelling the task stops the native work.
        """
        async for ev in self._aiterate(self._prepare(prompt, max_tokens, timeout, prefill_timeout, sampling)):
            yield ev

    async def _aiterate(self, req: _Request,
                        on_start: Callable[[_native.Run], None] | None = None) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        # the start runs in the executor and goes on if this task is cancelled meanwhile: whichever
        # of the two comes second (the start, or the cancel) closes the call
        lock = threading.Lock()
        abandoned = False
        started: list[_native.Run] = []

        def start() -> _native.Run | None:
            run = self._start(req)
            with lock:
                if not abandoned:
                    started.append(run)
                    return run
            self._finish(run)
            return None

        try:
            maybe_run = await asyncio.shield(loop.run_in_executor(None, start))
        except asyncio.CancelledError:
            with lock:
                abandoned = True
            for r in started:
                self._finish(r)  # one engine step at most
            raise
        assert maybe_run is not None
        run = maybe_run
        try:
            if on_start is not None:
                on_start(run)
            pull = _Pull(self, run, req)
            while True:
                event = pull.event(await loop.run_in_executor(None, run.next, pull.wait))
                yield event
                if isinstance(event, Done):
                    return
        finally:
            run.cancel()
            try:
                await asyncio.shield(loop.run_in_executor(None, self._finish, run))
            except asyncio.CancelledError:
                self._finish(run)  # cancelled again while closing: finish here (one step at most)
                raise

    async def astream(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
                      prefill_timeout: float | None = None, **sampling: Any) -> AsyncIterator[str]:
        """Async form of stream: yields non-empty text pieces."""
        agen = self.astream_events(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)
        try:
            async for ev in agen:
                if isinstance(ev, Token) and ev.text:
                    yield ev.text
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    # -- state -------------------------------------------------------------------------------------

    @property
    def last_stats(self) -> GenerationStats | None:
        """The figures of the last finished generation call, or None."""
        return self._last_stats

    @property
    def busy(self) -> bool:
        """True while a generation is running."""
        return bool(self._active)

    def cancel(self) -> None:
        """Stop the running generation (every running one, on a multi-sequence session), from any
        thread (no-op when idle).

        The consumer then receives Done with finish_reason "cancelled"; a prompt being decoded is
        interrupted at the next graph node.
        """
        with self._lock:
            runs = list(self._active)
        for run in runs:
            run.cancel()

    def _close_session(self) -> None:
        self._closed = True
        self.cancel()

    @property
    def model(self) -> Model:
        """The model this session runs."""
        return self._model

    @property
    def context(self) -> Context:
        """The context this session owns (n_ctx, n_threads, perf counters, ...)."""
        return self._context

    @property
    def n_ctx(self) -> int:
        """Context size in tokens."""
        return self._context.n_ctx

    def close(self) -> None:
        """Stop a running generation and free the context. Idempotent."""
        self._close_session()
        self._engine = None  # a still-running worker keeps what it needs until it has stopped
        self._context.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
