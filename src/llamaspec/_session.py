"""The session every generation object is: ``Generator`` (plain) and ``Speculative``/``MTP`` are
this class over one native engine (src/native/engine.h), with or without a drafter.

A subclass builds ``self._engine`` (a native Session) in its constructor and calls ``_init_session``.
This class turns the native calls' events into Python events, applies the timeouts, and makes
every exit path (exhaustion, break, close(), garbage collection, Ctrl-C, an exception, a cancelled
task) cancel the call and wait until the engine has let go of it, so that its sequence is free at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, CancelledError, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Literal, TypeVar

from . import _native
from ._log import sync_log_level
from ._options import call_options, logprobs_options, sampling_options
from .chat import ChatPrompt, build_chat_prompt
from .context import Context
from .errors import ClosedError, GenerationTimeout, InvalidOptionError
from .events import (
    ChatMessage,
    Done,
    EndOfGeneration,
    Event,
    GenerationStats,
    PromptProgress,
    Stats,
    Token,
    TopLogprob,
)
from .grammar import json_schema_to_grammar
from .model import Model
from .stats import PromptCacheInfo, PromptCacheRamInfo, SpecStats

_S = TypeVar("_S", bound="_StreamingSession")
# a Token's origin, by the native Origin's value (call.h)
_ORIGINS: tuple[Literal["plain", "draft", "target"], ...] = ("plain", "draft", "target")

Prompt = str | Sequence[int] | ChatPrompt
Messages = Sequence[Mapping[str, Any]]

logger = logging.getLogger("llamaspec")


@dataclass(frozen=True)
class _Request:
    tokens: list[int]
    max_tokens: int
    timeout: float | None
    prefill_timeout: float | None
    stop: list[str]
    grammar_root: str
    sampling: dict[str, Any]
    prompt_progress: bool = False
    draft_max: int = -1
    p_min: float = -1.0
    cache_prompt: bool = True
    logprobs: int = -1  # top candidates per token; -1: no log-probabilities
    post_sampling_probs: bool = False
    chat: ChatPrompt | None = None  # a chat call: its reply is parsed (ChatPrompt.parser)


def _check_timeout(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise InvalidOptionError(f"{name} must be a positive number of seconds or None, got {v!r}")
    return float(v)


def _check_every(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidOptionError(f"emit_stats_every must be an int >= 0, got {v!r}")
    return v


class _Pull:
    """One call's wait policy and event conversion, shared by the sync and async iterators:
    ``prefill_timeout`` bounds the wait for the first token, ``timeout`` each one after it."""

    def __init__(self, session: _StreamingSession, run: _native.Run, req: _Request) -> None:
        self._session = session
        self._run = run
        self._req = req
        self._first = True
        self._parser = req.chat.parser() if req.chat is not None else None

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

    def events(self, ev: tuple[Any, ...] | None) -> list[Event]:
        """``event(ev)``, and of a chat call what its text adds to the parsed reply: the deltas after
        the Token, the message in Done."""
        event = self.event(ev)
        parser = self._parser
        if parser is None:
            return [event]
        if isinstance(event, Token):
            return [event, *parser.feed(event.text)] if event.text else [event]
        if isinstance(event, Done):
            last: list[Event] = [*parser.finish()]
            return [*last, replace(event, message=parser.message)]
        return [event]


class _Waker:
    """Wakes an asyncio loop when a call has a new event, with no thread waiting for it: the engine
    writes a byte to a pipe whose read end the loop watches (``Run.set_wake_fd``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run: _native.Run) -> None:
        self._loop = loop
        self._run = run
        self._fut: asyncio.Future[None] | None = None
        self._r, self._w = os.pipe()
        try:
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
            loop.add_reader(self._r, self._readable)  # NotImplementedError: a loop without it
        except BaseException:
            os.close(self._r)
            os.close(self._w)
            raise
        run.set_wake_fd(self._w)

    def _readable(self) -> None:
        try:
            os.read(self._r, 4096)
        except BlockingIOError:
            pass
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    async def next(self, wait: float) -> tuple[Any, ...] | None:
        """The next event, or None after ``wait`` seconds (< 0: no limit)."""
        deadline = None if wait < 0 else self._loop.time() + wait
        while True:
            raw = self._run.next(0.0)  # a look: never blocks
            if raw is not None:
                return raw
            left = None if deadline is None else deadline - self._loop.time()
            if left is not None and left <= 0:
                return None
            # no await between the look above and this one: a byte written meanwhile is seen by
            # _readable once we wait, and completes this future
            fut = self._fut = self._loop.create_future()
            timer = None if left is None else self._loop.call_later(left, _settle, fut)
            try:
                await fut
            finally:
                self._fut = None
                if timer is not None:
                    timer.cancel()

    def close(self) -> None:
        self._run.set_wake_fd(-1)  # the engine writes no more once this returns
        self._loop.remove_reader(self._r)
        os.close(self._r)
        os.close(self._w)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _StreamingSession:
    """What every session shares: streaming (sync and async), batches, statistics, cancellation."""

    _engine: _native.Session | None
    _model: Model
    _context: Context  # the context the session decodes on (the target, for speculative sessions)

    def _init_session(self, model: Model, native: _native.Session, options: dict[str, Any], n_seq: int) -> None:
        self._lock = threading.Lock()
        self._active: list[_native.Run] = []  # running calls (several on multi-sequence sessions)
        self._last_stats: GenerationStats | None = None
        self._closed = False
        self._model = model
        # the session tokenizes with the weights it runs: Model.close() only drops the Model's handle
        self._native_model: _native.Model = model._require()
        self._engine = native
        self._n_seq = n_seq
        self._context = Context._from_native(model, native.target, options)

    # -- request preparation (eager: errors surface at the call, not at the first next()) ---------

    def _prepare(self, prompt: Prompt | None, max_tokens: int, timeout: float | None,
                 prefill_timeout: float | None, sampling: dict[str, Any],
                 messages: Messages | None = None) -> _Request:
        if self._closed:
            raise ClosedError(f"this {type(self).__name__} is closed")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidOptionError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        opts = sampling_options(sampling)
        logprobs, post_sampling = logprobs_options(opts)
        stop = opts.pop("stop", [])
        grammar_root = opts.pop("grammar_root", None) or "root"
        schema = opts.pop("json_schema", None)
        if schema is not None:
            if opts.get("grammar") or grammar_root != "root":
                raise InvalidOptionError("give json_schema or grammar (with grammar_root), not both")
            opts["grammar"] = json_schema_to_grammar(schema)
        if (prompt is None) == (messages is None):
            raise InvalidOptionError("give either a prompt or messages=, not both" if prompt is not None
                                     else "give a prompt or messages=")
        chat = build_chat_prompt(self._native_model, messages) if messages is not None else prompt
        if isinstance(chat, ChatPrompt):
            tokens = list(chat.tokens)
            tool_sampling = chat.sampling()
            if "tool_grammar" in tool_sampling and (opts.get("grammar") or grammar_root != "root"):
                raise InvalidOptionError("a chat prompt with tools brings its own grammar: give no grammar, "
                                         "grammar_root or json_schema with it (or tool_choice='none')")
            opts.update(tool_sampling)
            stop = [*stop, *(s for s in chat.stops if s not in stop)]
        elif isinstance(prompt, str):
            tokens = list(self._native_model.tokenize(prompt, True, True))
        elif isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
            items: list[object] = list(prompt)
            tokens = []
            for t in items:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise InvalidOptionError(f"a token-id prompt must hold ints, not {type(t).__name__}")
                tokens.append(t)
        else:
            raise InvalidOptionError(f"prompt must be a str, a list of token ids or a ChatPrompt, "
                                     f"not {type(prompt).__name__}")
        if not tokens:
            raise InvalidOptionError("the prompt is empty")
        return _Request(tokens, max_tokens, _check_timeout("timeout", timeout),
                        _check_timeout("prefill_timeout", prefill_timeout), stop, grammar_root, opts,
                        logprobs=logprobs, post_sampling_probs=post_sampling,
                        chat=chat if isinstance(chat, ChatPrompt) else None)

    @staticmethod
    def _call_options(req: _Request, prompt_progress: bool, draft_max: int | None,
                      p_min: float | None, cache_prompt: bool) -> _Request:
        progress, cap, threshold, cache = call_options(prompt_progress, draft_max, p_min, cache_prompt)
        return replace(req, prompt_progress=progress, draft_max=cap, p_min=threshold, cache_prompt=cache)

    def _require(self) -> _native.Session:
        native = self._engine
        if native is None:
            raise ClosedError(f"this {type(self).__name__} is closed")
        return native

    def _start(self, req: _Request) -> _native.Run:
        native = self._require()
        sync_log_level()
        run = native.start(req.tokens, req.max_tokens, req.stop, req.sampling, req.grammar_root,
                           req.prompt_progress, req.draft_max, req.p_min, req.cache_prompt, req.logprobs,
                           req.post_sampling_probs)
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
            origin = _ORIGINS[ev[3]]
            if len(ev) == 5:
                return Token(ev[1], ev[2], origin=origin, drafted=ev[4])
            top = tuple(TopLogprob(i, b.decode("utf-8", "replace"), lp, b) for i, b, lp in ev[6])
            return Token(ev[1], ev[2], ev[5], top, origin, ev[4])
        if kind == 1:
            return EndOfGeneration()
        if kind == 4:
            return PromptProgress(ev[1], ev[2], ev[3], ev[4])
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
                for event in pull.events(run.next(pull.wait)):
                    yield event
                    if isinstance(event, Done):
                        return
        finally:
            self._finish(run)

    def stream_events(self, prompt: Prompt | None = None, max_tokens: int = 256,
                      timeout: float | None = 60.0, *,
                      messages: Messages | None = None, prefill_timeout: float | None = None,
                      emit_stats_every: int = 0, prompt_progress: bool = False,
                      draft_max: int | None = None, p_min: float | None = None,
                      cache_prompt: bool = True, **sampling: Any) -> Iterator[Event]:
        """Generate, yielding Token events (and a Stats event every ``emit_stats_every`` tokens when
        > 0), then EndOfGeneration (if the model stopped), then Done.

        The decode loop runs in C++ with the GIL released. Leaving the loop early (break, close(),
        garbage collection, an exception, Ctrl-C) stops the native work within one step, also in the
        middle of a long prompt, and the sequence is free for the next call at once.

        Args:
            prompt: text (tokenized with BOS as the model wants and special tokens parsed), token ids,
                or a ChatPrompt (Model.chat_prompt: its tools' grammar and stop strings apply).
            messages: instead of a prompt, a chat (OpenAI-style messages) rendered with the model's
                template; its text never becomes control tokens. Same as passing
                ``Model.chat_prompt(messages)`` as the prompt; for tools and template options, pass
                such a ChatPrompt: a chat call also streams the parsed reply (ContentDelta,
                ReasoningDelta, ToolCallStart, ToolCallArguments) and Done carries it whole.
            max_tokens: exact upper bound on generated tokens (>= 1).
            timeout: seconds to wait for each token after the first (None: no limit).
            prefill_timeout: seconds to wait for the first token (None: no limit).
            emit_stats_every: an int >= 0; when > 0, a Stats event every that many tokens with the
                session's totals (with n_seq > 1: the counters of the call's sequence).
            prompt_progress: PromptProgress events while the prompt is decoded (one before it, one
                after each n_batch chunk).
            draft_max: this call's longest draft, an int >= 0 (0: no drafting for this call), at
                most the session's; None: the session's. The output does not change, only the speed.
            p_min: this call's draft confidence threshold in [0, 1] (a drafter stops at a token it
                gives a lower probability); None: the session's. Only the speed changes.
            cache_prompt: reuse what the sequence's memory still holds of this prompt from earlier
                calls (the longest common prefix; Done.stats.cached_tokens says how much); False
                decodes the whole prompt. The output does not change, only the time to the first
                token (README, "Prompt cache").
            **sampling: sampling options (README, "Sampling"); ``stop`` ends the text before the first
                stop string (which is not emitted).

        Returns:
            An iterator of events; the generation starts at the first ``next()``.

        Raises:
            InvalidOptionError: an invalid option or prompt (here, at the call).
            TypeError: an unknown option (here, at the call).
            ContextOverflowError: prompt + max_tokens > n_ctx (at the first ``next()``).
            BusyError: every sequence of this session is generating (at the first ``next()``).
            GrammarError: the grammar does not parse (at the first ``next()``).
            GenerationTimeout: a timeout passed; the native work was stopped.
        """
        every = _check_every(emit_stats_every)
        req = self._prepare(prompt, max_tokens, timeout, prefill_timeout, sampling, messages)
        req = self._call_options(req, prompt_progress, draft_max, p_min, cache_prompt)
        if every == 0:
            return self._iterate(req)
        seq: list[int] = []
        return self._with_stats(self._iterate(req, lambda run: seq.append(run.seq)), every, seq)

    def _call_stats(self, seq: list[int]) -> SpecStats:
        """What a Stats event carries: the totals, or with several sequences the call's sequence."""
        return self.stats(seq[0] if self._n_seq > 1 and seq else None)

    def _with_stats(self, events: Iterator[Event], every: int, seq: list[int]) -> Iterator[Event]:
        n = 0
        try:
            for ev in events:
                yield ev
                if isinstance(ev, Token):
                    n += 1
                    if n % every == 0:
                        yield Stats(self._call_stats(seq))
        finally:
            events.close()  # type: ignore[attr-defined]

    def stream(self, prompt: Prompt | None = None, max_tokens: int = 256,
               timeout: float | None = 60.0, *,
               messages: Messages | None = None, prefill_timeout: float | None = None,
               **sampling: Any) -> Iterator[str]:
        """Generate, yielding text pieces as they are ready (see stream_events for arguments/errors).

        Returns:
            An iterator of non-empty str pieces whose concatenation is the generated text.
        """
        events = self.stream_events(prompt, max_tokens, timeout, messages=messages,
                                    prefill_timeout=prefill_timeout, **sampling)
        return (ev.text for ev in events if isinstance(ev, Token) and ev.text)

    def chat(self, messages: Messages | ChatPrompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
             prefill_timeout: float | None = None, **sampling: Any) -> ChatMessage:
        """Generate a chat reply and return it parsed: content, reasoning and tool calls.

        Args:
            messages: OpenAI-style messages, or a ChatPrompt (Model.chat_prompt, e.g. with tools).
            max_tokens, timeout, prefill_timeout, **sampling: as for ``generate``.

        Returns:
            The reply (its ``to_dict()`` is the assistant message to append to the conversation);
            ``last_stats`` holds the call's figures.

        Raises:
            As ``stream_events``.
        """
        prompt = messages if isinstance(messages, ChatPrompt) else build_chat_prompt(self._native_model,
                                                                                      messages)
        events = self.stream_events(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)
        try:
            for ev in events:
                if isinstance(ev, Done) and ev.message is not None:
                    return ev.message
        finally:
            events.close()  # type: ignore[attr-defined]
        raise RuntimeError("the chat call ended without its message")  # unreachable: Done always comes

    def generate(self, prompt: Prompt | None = None, max_tokens: int = 256,
                 timeout: float | None = 60.0, *,
                 messages: Messages | None = None, prefill_timeout: float | None = None,
                 **sampling: Any) -> str:
        """Generate and return the whole text (see stream_events for arguments and errors).

        Ctrl-C while it blocks stops the native work and raises KeyboardInterrupt.

        Returns:
            The generated text; ``last_stats`` holds the call's figures.
        """
        events = self.stream_events(prompt, max_tokens, timeout, messages=messages,
                                    prefill_timeout=prefill_timeout, **sampling)
        try:
            return "".join(ev.text for ev in events if isinstance(ev, Token))
        finally:
            events.close()  # type: ignore[attr-defined]

    # -- async iteration ---------------------------------------------------------------------------

    async def astream_events(self, prompt: Prompt | None = None, max_tokens: int = 256,
                             timeout: float | None = 60.0, *,
                             messages: Messages | None = None, prefill_timeout: float | None = None,
                             emit_stats_every: int = 0, prompt_progress: bool = False,
                             draft_max: int | None = None, p_min: float | None = None,
                             cache_prompt: bool = True, **sampling: Any) -> AsyncIterator[Event]:
        """Async form of stream_events. Never blocks the event loop: the engine wakes the loop when
        an event is ready (a pipe the loop watches); only the start and the close of a call run in
        the loop's default executor. Cancelling the task stops the native work.
        """
        every = _check_every(emit_stats_every)
        seq: list[int] = []
        req = self._prepare(prompt, max_tokens, timeout, prefill_timeout, sampling, messages)
        agen = self._aiterate(self._call_options(req, prompt_progress, draft_max, p_min, cache_prompt),
                              lambda run: seq.append(run.seq))
        n = 0
        try:
            async for ev in agen:
                yield ev
                if every and isinstance(ev, Token):
                    n += 1
                    if n % every == 0:
                        yield Stats(self._call_stats(seq))
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    async def _aiterate(self, req: _Request,
                        on_start: Callable[[_native.Run], None] | None = None) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        # the start runs in the executor (it builds the sampler and may wait for the engine) and goes
        # on if this task is cancelled meanwhile: whichever of the two comes second closes the call
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
        waker: _Waker | None = None
        try:
            if on_start is not None:
                on_start(run)
            try:
                waker = _Waker(loop, run)
            except NotImplementedError:  # a loop that cannot watch a descriptor: wait in a thread
                waker = None
            pull = _Pull(self, run, req)
            while True:
                wait = pull.wait
                raw = await (waker.next(wait) if waker is not None
                             else loop.run_in_executor(None, run.next, wait))
                for event in pull.events(raw):
                    yield event
                    if isinstance(event, Done):
                        return
        finally:
            if waker is not None:
                waker.close()
            run.cancel()
            try:
                await asyncio.shield(loop.run_in_executor(None, self._finish, run))
            except asyncio.CancelledError:
                self._finish(run)  # cancelled again while closing: finish here (one step at most)
                raise

    async def astream(self, prompt: Prompt | None = None, max_tokens: int = 256,
                      timeout: float | None = 60.0, *,
                      messages: Messages | None = None, prefill_timeout: float | None = None,
                      **sampling: Any) -> AsyncIterator[str]:
        """Async form of stream: yields non-empty text pieces."""
        agen = self.astream_events(prompt, max_tokens, timeout, messages=messages,
                                  prefill_timeout=prefill_timeout, **sampling)
        try:
            async for ev in agen:
                if isinstance(ev, Token) and ev.text:
                    yield ev.text
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    # -- batches and statistics --------------------------------------------------------------------

    def generate_batch(self, prompts: Sequence[Prompt], max_tokens: int = 256, timeout: float | None = 60.0, *,
                       prefill_timeout: float | None = None, **sampling: Any) -> list[str]:
        """Generate for several prompts at once, n_seq at a time, sharing every target pass (and
        draft call); each output is what ``generate`` gives for that prompt alone.

        Args:
            prompts: texts or token-id lists.
            max_tokens, timeout, prefill_timeout, **sampling: as for ``generate``, for every prompt
                (a ``seed`` gives every prompt the same seed).

        Returns:
            The generated texts, in the order of the prompts.

        Raises:
            As ``generate``; the first error of any prompt is raised after every call has stopped.
            BusyError: other calls hold the sequences this one needs.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidOptionError("prompts must be a sequence of prompts (texts or token-id lists)")
        reqs = [self._prepare(p, max_tokens, timeout, prefill_timeout, dict(sampling)) for p in prompts]
        if not reqs:
            return []
        started: list[_native.Run] = []
        stopping = False
        lock = threading.Lock()

        def on_start(run: _native.Run) -> None:
            with lock:
                started.append(run)
                if stopping:  # the batch is being left: a call that starts now stops at once
                    run.cancel()

        def one(req: Any) -> str:
            with lock:
                if stopping:
                    raise CancelledError
            events = self._iterate(req, on_start)
            try:
                return "".join(ev.text for ev in events if isinstance(ev, Token))
            finally:
                events.close()  # type: ignore[attr-defined]

        with ThreadPoolExecutor(max_workers=min(self._n_seq, len(reqs)),
                                thread_name_prefix="llamaspec-batch") as pool:
            futures = [pool.submit(one, r) for r in reqs]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)  # an error stops the batch at once
                for f in futures:
                    if f.done() and f.exception() is not None:
                        raise f.exception()  # type: ignore[misc]
                return [f.result() for f in futures]
            except BaseException:
                with lock:
                    stopping = True
                    for run in started:
                        run.cancel()
                for f in futures:
                    f.cancel()
                raise

    def stats(self, seq: int | None = None) -> SpecStats:
        """Cumulative statistics, with one StageStats per stage; readable from any thread, also
        mid-stream, without blocking it.

        Args:
            seq: None for the session's totals, or a sequence (0 .. n_seq - 1; a call's sequence is
                ``Done.stats.seq``) for the calls that ran on it. The totals' counts are the sums of
                the sequences'; their times count each shared draft or verify pass once (a
                sequence's times are those of the passes it took part in), and their tokens/s is
                the session's throughput (tokens over the time any sequence was generating).

        Raises:
            InvalidOptionError: seq is out of range.
            ClosedError: the session is closed.
        """
        if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < self._n_seq):
            raise InvalidOptionError(f"seq must be None or within [0, {self._n_seq}), got {seq!r}")
        return SpecStats._from_native(self._require().stats(-1 if seq is None else seq))

    def prompt_cache(self) -> tuple[PromptCacheInfo, ...]:
        """What each sequence (index = seq) holds for the next call; readable from any thread.

        Raises:
            ClosedError: the session is closed.
        """
        return tuple(PromptCacheInfo(*t) for t in self._require().prompt_cache())

    def prompt_cache_ram(self) -> PromptCacheRamInfo:
        """What the host-memory prompt cache holds (``prompt_cache_mb``); readable from any thread.

        Raises:
            ClosedError: the session is closed.
        """
        prompts, tokens, n_bytes, limit = self._require().prompt_cache_ram()
        return PromptCacheRamInfo(prompts, tokens, n_bytes, None if limit == 2**64 - 1 else limit)

    def reset_stats(self) -> None:
        """Zero the cumulative statistics.

        Raises:
            ClosedError: the session is closed.
        """
        self._require().reset_stats()

    def print_stats(self) -> str:
        """Log (logger "llamaspec", INFO) and return a summary in the form of upstream's.

        Raises:
            ClosedError: the session is closed.
        """
        text = self.stats().summary()
        logger.info("%s", text)
        return text


    # -- state -------------------------------------------------------------------------------------

    @property
    def last_stats(self) -> GenerationStats | None:
        """The figures of the last finished generation call, or None."""
        return self._last_stats

    @property
    def n_seq(self) -> int:
        """Sequences this session decodes together (calls that may run at once)."""
        return self._n_seq

    @property
    def n_running(self) -> int:
        """Calls running now (each on its own sequence)."""
        with self._lock:
            return len(self._active)

    @property
    def busy(self) -> bool:
        """True while every sequence is taken: a new call now would raise BusyError (with
        ``n_seq=1``: while a generation runs)."""
        native = self._engine
        return native is not None and native.busy

    def cancel(self) -> None:
        """Stop the running generation (every running one, on a multi-sequence session), from any
        thread (no-op when idle).

        The consumer then receives Done with finish_reason "cancelled"; a prompt being decoded is
        interrupted at the next graph node. A cancel that arrives after a call has ended does
        nothing, to that call or to any later one.
        """
        with self._lock:
            runs = list(self._active)
        for run in runs:
            run.cancel()

    @property
    def model(self) -> Model:
        """The model this session runs."""
        return self._model

    @property
    def context(self) -> Context:
        """The context this session decodes on (n_ctx, n_threads, perf counters, ...). Its
        ``decode``/``clear``/``logits`` raise BusyError while the session generates (the engine owns
        it then), and a generation that would start during such a call raises BusyError."""
        return self._context

    @property
    def n_ctx(self) -> int:
        """Context size in tokens (per sequence)."""
        return self._context.n_ctx

    def close(self) -> None:
        """Stop the running generations and free the contexts (once the engine has let go of them).
        Idempotent."""
        self._closed = True
        self.cancel()
        self._engine = None  # a still-running call keeps what it needs until it has stopped
        self._context.close()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
