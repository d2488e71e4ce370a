"""The served model: one Model, one session with ``n_seq`` sequences, a FIFO queue in front of it, and
the counters /metrics and /slots read.

Requests never see BusyError: up to ``n_seq`` run at once (they share every decode pass, as the
session's engine batches them), the next ``queue`` wait in arrival order, and beyond that ``QueueFull``
(HTTP 503 with Retry-After). A request whose consumer goes away (a client that disconnects cancels
the task reading the stream) ends its call within one engine step: ``astream_events`` cancels it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from .._flags import session_from_args
from ..chat import ChatPrompt
from ..errors import InvalidOptionError
from ..events import Done, Event, GenerationStats, Token
from ..generator import Generator
from ..grammar import json_schema_to_grammar
from ..model import Model
from ..speculative import Speculative
from .config import ServerConfig
from .protocol import ApiError, Sampling


@dataclass(frozen=True)
class Call:
    """One generation call of a request: prompt ids, the exact token limit, sampling options, the
    call's draft cap and draft confidence threshold (None: the session's), whether to stream
    prompt progress, whether to reuse the sequence's cache (llama-server's cache_prompt), and of a
    chat request the ChatPrompt the ids come from."""

    ids: list[int]
    max_tokens: int
    sampling: dict[str, Any]
    draft_max: int | None = None
    p_min: float | None = None
    progress: bool = False
    cache_prompt: bool = True
    chat: ChatPrompt | None = None  # a chat request's prompt: its reply is parsed (tools, reasoning)

    def settings(self) -> dict[str, Any]:
        """The call's settings as JSON (llama-server's generation_settings); a banned token's bias
        (-inf) is null, as llama-server writes it."""
        out = {"n_predict": self.max_tokens, **self.sampling}
        out["n_probs"] = out.get("top_logprobs", 0) if out.get("logprobs") else 0
        if "logit_bias" in out:
            out["logit_bias"] = [[t, b if math.isfinite(b) else None] for t, b in out["logit_bias"].items()]
        return out


class QueueFull(Exception):
    """Every sequence is busy and the wait queue is full."""


@dataclass
class Slot:
    """What /slots shows of one sequence."""

    id: int
    id_task: int = -1
    is_processing: bool = False
    n_prompt_tokens: int = 0
    n_prompt_tokens_cache: int = 0
    n_decoded: int = 0
    n_remain: int = -1
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Totals:
    """Server-wide counters since start (what /metrics exports)."""

    requests: int = 0
    prompt_tokens: int = 0  # decoded (llama-server's "processed"): the cached ones are apart
    prompt_tokens_cached: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    drafts_generated: int = 0
    drafts_accepted: int = 0
    verify_steps: int = 0
    n_tokens_max: int = 0
    last_prompt_rate: float = 0.0
    last_predicted_rate: float = 0.0

    def add(self, st: GenerationStats) -> None:
        self.requests += 1
        self.prompt_tokens += st.prompt_tokens - st.cached_tokens
        self.prompt_tokens_cached += st.cached_tokens
        self.prompt_seconds += st.prefill_time
        self.predicted_tokens += st.tokens
        self.predicted_seconds += st.generation_time
        self.drafts_generated += st.drafts_generated
        self.drafts_accepted += st.drafts_accepted
        self.verify_steps += st.iterations
        self.n_tokens_max = max(self.n_tokens_max, st.prompt_tokens + st.tokens)
        if st.prefill_time > 0:
            self.last_prompt_rate = (st.prompt_tokens - st.cached_tokens) / st.prefill_time
        self.last_predicted_rate = st.tokens_per_second


def open_session(cfg: ServerConfig, model: Model) -> tuple[Generator | Speculative, str, int]:
    """The session the server runs on: (session, method name or "none", context per sequence)."""
    n_ctx_total = cfg.n_ctx or min(model.n_ctx_train or 4096, 16384)
    n_ctx_seq = max(n_ctx_total // cfg.n_seq, 8)
    session, method = session_from_args(
        model,
        cfg,
        n_ctx_seq,
        n_seq=cfg.n_seq,
        ctx_checkpoints=cfg.ctx_checkpoints,
        checkpoint_every=cfg.checkpoint_every,
        prompt_cache_mb=cfg.cache_ram_mb,
    )
    return session, method, n_ctx_seq


class ServedModel:
    """The model, its session and the queue in front of it. Create and use on the event loop."""

    def __init__(
        self,
        cfg: ServerConfig,
        model: Model,
        session: Generator | Speculative,
        method: str,
        n_ctx_seq: int,
        chat_template: str | None,
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.session = session
        self.method = method
        self.n_ctx_seq = n_ctx_seq
        self.chat_template = chat_template
        self.started = time.time()
        self.slots = [Slot(i) for i in range(cfg.n_seq)]
        self.totals = Totals()
        self.waiting = 0
        self._free = asyncio.Semaphore(cfg.n_seq)  # FIFO: asyncio wakes waiters in arrival order
        self._next_task = 0

    @functools.cached_property
    def eog_ids(self) -> list[int]:
        """Every end-of-generation token id (for ignore_eos)."""
        return [i for i in range(self.model.n_vocab) if self.model.is_eog(i)]

    @property
    def processing(self) -> int:
        """Requests decoding now."""
        return sum(s.is_processing for s in self.slots)

    def check_ids(self, ids: list[int]) -> None:
        """ApiError 400 naming the first id outside the vocabulary."""
        n_vocab = self.model.n_vocab
        if ids and (min(ids) < 0 or max(ids) >= n_vocab):
            bad = next(i for i in ids if not 0 <= i < n_vocab)
            raise ApiError(400, f"token id {bad} is out of range")

    def plan(self, ids: list[int], req: Sampling, n: int = 1, chat: ChatPrompt | None = None) -> list[Call]:
        """The calls of a request for one prompt (n choices), or an ApiError: the prompt and its ids
        are checked, max_tokens is capped at the context, sampling is the server's defaults with the
        request's fields over them. With a seed, choice i samples with seed + i (the choices differ
        and the request stays reproducible)."""
        if not ids:
            raise ApiError(400, "the prompt is empty")
        self.check_ids(ids)
        room = self.n_ctx_seq - len(ids)
        if room <= 0:
            raise ApiError(
                400,
                f"the request exceeds the available context size ({len(ids)} prompt tokens, "
                f"context {self.n_ctx_seq} per sequence)",
                type="exceed_context_size_error",
                n_prompt_tokens=len(ids),
                n_ctx=self.n_ctx_seq,
            )
        limit = req.limit(self.cfg.n_predict)
        if limit == 0:
            raise ApiError(400, "max_tokens must be >= 1")
        if limit < 0 or limit > room:
            limit = room
        spec = req.speculative
        sampling = req.options(self.cfg.sampling, self.model.n_vocab, self.model.tokenize)
        if "json_schema" in sampling:  # converted once for all choices; a bad schema is the client's 400
            try:
                sampling["grammar"] = json_schema_to_grammar(sampling.pop("json_schema"))
            except InvalidOptionError as e:
                raise ApiError(400, str(e)) from None
        if req.ignore_eos:  # llama-server's field: end-of-generation tokens are never sampled
            sampling["logit_bias"] = {
                **{t: -math.inf for t in self.eog_ids},
                **sampling.get("logit_bias", {}),
            }
        call = Call(
            ids,
            limit,
            sampling,
            draft_max=spec.n_max if spec is not None else None,
            p_min=spec.p_min if spec is not None else None,
            progress=req.return_progress,
            cache_prompt=req.cache_prompt,
            chat=chat,
        )
        seed = sampling.get("seed")
        if n == 1 or seed is None:
            return [call] * n
        return [
            dataclasses.replace(call, sampling={**sampling, "seed": (seed + i) % 0xFFFFFFFF})
            for i in range(n)
        ]

    async def generate(self, call: Call, *, announce: bool = False) -> AsyncIterator[Event]:
        """Queue, then run one call; yields its events (PromptProgress* when asked for, Token*,
        EndOfGeneration?, Done). With ``announce`` the PromptProgress events come whether the call
        asked for them or not, the first one as soon as the call has started (its options checked,
        its sampler built, its cache reused), before its prompt is decoded; the caller drops those
        the call did not ask for.

        Raises:
            QueueFull: every sequence is busy and ``cfg.queue`` requests already wait.
        """
        if self._free.locked() and self.waiting >= self.cfg.queue:
            raise QueueFull
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        slot = next(s for s in self.slots if not s.is_processing)
        self._next_task += 1
        slot.id_task, slot.is_processing = self._next_task, True
        slot.n_prompt_tokens, slot.n_decoded, slot.n_remain = len(call.ids), 0, call.max_tokens
        slot.params = call.settings()
        try:
            agen = self.session.astream_events(
                call.chat if call.chat is not None else call.ids,
                call.max_tokens,
                None,
                prefill_timeout=None,
                prompt_progress=call.progress or announce,
                draft_max=call.draft_max,
                p_min=call.p_min,
                cache_prompt=call.cache_prompt,
                **call.sampling,
            )
            try:
                async for ev in agen:
                    if isinstance(ev, Done):
                        self.totals.add(ev.stats)
                        slot.n_prompt_tokens_cache = ev.stats.cached_tokens
                    elif isinstance(ev, Token):
                        slot.n_decoded += 1
                        slot.n_remain = call.max_tokens - slot.n_decoded
                    yield ev
            finally:
                await agen.aclose()  # type: ignore[attr-defined]
        finally:
            slot.is_processing = False
            self._free.release()

    def close(self) -> None:
        """Stop every running call and free the session and the model."""
        self.session.cancel()
        self.session.close()
        self.model.close()
