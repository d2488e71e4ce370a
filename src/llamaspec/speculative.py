"""MTP: speculative decoding whose drafter is the Multi-Token-Prediction head in the model's own GGUF."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from . import _native
from ._log import sync_log_level
from ._options import context_options
from ._session import Prompt, _StreamingSession
from .context import Context
from .errors import ClosedError, InvalidOptionError, UnsupportedModelError
from .events import Event, Stats, Token
from .model import Model

__all__ = ["MTP", "SpecStats"]

logger = logging.getLogger("llamaspec")


@dataclass(frozen=True, slots=True)
class SpecStats:
    """Cumulative statistics of a speculative session (all calls since creation or reset_stats()).

    Every snapshot is internally consistent: the counters were copied together.

    Attributes:
        iterations: verify passes of the target (the prompt pass is not one).
        drafts_generated: draft tokens proposed.
        drafts_accepted: draft tokens the target accepted.
        acceptance_rate: drafts_accepted / drafts_generated (0.0 when nothing was drafted).
        tokens_emitted: Token events emitted.
        tokens_per_second: sum of (tokens - 1) over calls / sum of their first-to-last-token times
            (prompt excluded).
        timing_us: microseconds spent in "draft", "verify", "sample", "prefill", and "total".
        n_draft: the maximum draft length.
        mean_accepted_length: accepted drafts per verify + 1 (tokens per target pass).
        accepted_per_position: how often draft position i was accepted (length n_draft).
        drafted_per_position: how often a draft reached position i (length n_draft).
    """

    iterations: int
    drafts_generated: int
    drafts_accepted: int
    acceptance_rate: float
    tokens_emitted: int
    tokens_per_second: float
    timing_us: dict[str, float]
    n_draft: int
    mean_accepted_length: float
    accepted_per_position: tuple[int, ...]
    drafted_per_position: tuple[int, ...]

    @classmethod
    def _from_native(cls, d: dict[str, Any]) -> SpecStats:
        gen, acc, it = int(d["drafts_generated"]), int(d["drafts_accepted"]), int(d["iterations"])
        window = float(d["window_s"])
        return cls(
            iterations=it,
            drafts_generated=gen,
            drafts_accepted=acc,
            acceptance_rate=acc / gen if gen else 0.0,
            tokens_emitted=int(d["tokens_emitted"]),
            tokens_per_second=int(d["rate_tokens"]) / window if window > 0 else 0.0,
            timing_us={k: float(d[f"{k}_us"]) for k in ("draft", "verify", "sample", "prefill", "total")},
            n_draft=int(d["n_draft"]),
            mean_accepted_length=acc / it + 1.0 if it else 0.0,
            accepted_per_position=tuple(int(x) for x in d["accepted_per_position"]),
            drafted_per_position=tuple(int(x) for x in d["drafted_per_position"]),
        )

    def summary(self, method: str = "draft-mtp") -> str:
        """A summary in the form of upstream's speculative statistics, built from our counters."""
        rates = ", ".join(f"{a / self.iterations:.3f}" if self.iterations else "0.000"
                          for a in self.accepted_per_position)
        t = self.timing_us
        return (
            f"statistics {method:>16}: #iterations = {self.iterations}, #gen tokens = {self.drafts_generated}, "
            f"#acc tokens = {self.drafts_accepted}, acceptance = {100 * self.acceptance_rate:.2f}%, "
            f"#mean acc len = {self.mean_accepted_length:.2f}, #acc rate/pos = ({rates}), "
            f"#emitted = {self.tokens_emitted}, {self.tokens_per_second:.2f} tok/s, "
            f"dur(draft,verify,sample,prefill,total) = {t['draft'] / 1e3:.3f}, {t['verify'] / 1e3:.3f}, "
            f"{t['sample'] / 1e3:.3f}, {t['prefill'] / 1e3:.3f}, {t['total'] / 1e3:.3f} ms"
        )


class MTP(_StreamingSession):
    """Speculative decoding with the model's own Multi-Token-Prediction head as the drafter.

    Output is identical to plain decoding with the same sampling options (greedy: token for token;
    seeded sampling: the target draws one sample per emitted token, as plain decoding does), only
    faster when the drafts are accepted. One generation at a time; every call starts from a clean
    KV cache and recurrent state; ``stats()`` may be read from any thread at any time.

    Example:
        >>> model = llamaspec.Model("Qwen3.6-35B-A3B-MTP-Q4_K_M.gguf")
        >>> with llamaspec.MTP(model, n_draft=3, n_ctx=8192) as mtp:
        ...     for piece in mtp.stream("Write a haiku about the sea:", max_tokens=200):
        ...         print(piece, end="")
        ...     print(mtp.stats().acceptance_rate)
    """

    def __init__(self, model: Model, *, n_draft: int = 3, n_ctx: int = 2048, **options: Any) -> None:
        """Build the target context, the MTP draft context and the speculative state.

        Args:
            model: a model whose file carries MTP layers, loaded with ``load_mtp=True`` (the default).
            n_draft: maximum draft tokens per verify (>= 1).
            n_ctx: context size for both contexts.
            **options: other context options (see Context), applied to both contexts.

        Raises:
            InvalidOptionError: n_draft is not an int >= 1, or an option value is invalid.
            TypeError: an unknown option.
            UnsupportedModelError: the model has no MTP layers, or was loaded with load_mtp=False.
        """
        self._init_session()
        self._model = model
        if isinstance(n_draft, bool) or not isinstance(n_draft, int) or n_draft < 1:
            raise InvalidOptionError(f"n_draft must be an int >= 1, got {n_draft!r}")
        opts = context_options({"n_ctx": n_ctx, **options})
        native_model = model._require()
        if model.n_layer_nextn <= 0:
            raise UnsupportedModelError(
                f"'{model.path}' has no MTP layers (nextn_predict_layers is 0 or absent in the file); "
                "MTP needs a GGUF that carries an MTP head (e.g. a Qwen3.5/3.6 '-MTP' quant)",
                path=model.path,
            )
        sync_log_level()
        self._native: _native.SpecSession | None = _native.SpecSession.create_mtp(native_model, opts, n_draft)
        self._engine = self._native
        self._n_draft = n_draft
        self._context = Context._from_native(model, self._native.target, opts)

    @property
    def n_draft(self) -> int:
        """Maximum draft tokens per verify."""
        return self._n_draft

    # -- streaming with periodic statistics ---------------------------------------------------------

    def stream_events(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
                      prefill_timeout: float | None = None, emit_stats_every: int = 0,
                      **sampling: Any) -> Iterator[Event]:
        """Generate speculatively, yielding Token events (and Stats every ``emit_stats_every``
        tokens when > 0), then EndOfGeneration (if the model stopped), then Done.

        Arguments, errors and semantics are Generator.stream_events'; ``emit_stats_every`` is an
        int >= 0. Done.stats carries the call's iterations, drafts_generated and drafts_accepted.
        """
        every = _check_every(emit_stats_every)
        events = super().stream_events(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)
        return events if every == 0 else self._with_stats(events, every)

    def _with_stats(self, events: Iterator[Event], every: int) -> Iterator[Event]:
        n = 0
        try:
            for ev in events:
                yield ev
                if isinstance(ev, Token):
                    n += 1
                    if n % every == 0:
                        yield Stats(self.stats())
        finally:
            events.close()  # type: ignore[attr-defined]

    def stream(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
               prefill_timeout: float | None = None, emit_stats_every: int = 0, **sampling: Any) -> Iterator[str]:
        """Generate speculatively, yielding text pieces (Stats events are not part of the text)."""
        _check_every(emit_stats_every)
        return super().stream(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)

    async def astream_events(self, prompt: Prompt, max_tokens: int = 256, timeout: float | None = 60.0, *,
                             prefill_timeout: float | None = None, emit_stats_every: int = 0,
                             **sampling: Any) -> AsyncIterator[Event]:
        """Async form of stream_events (never blocks the event loop)."""
        every = _check_every(emit_stats_every)
        agen = super().astream_events(prompt, max_tokens, timeout, prefill_timeout=prefill_timeout, **sampling)
        n = 0
        try:
            async for ev in agen:
                yield ev
                if every and isinstance(ev, Token):
                    n += 1
                    if n % every == 0:
                        yield Stats(self.stats())
        finally:
            await agen.aclose()  # type: ignore[attr-defined]

    def _require(self) -> _native.SpecSession:
        native = self._native
        if native is None:
            raise ClosedError("this MTP session is closed")
        return native

    def stats(self) -> SpecStats:
        """Cumulative statistics; readable from any thread, also mid-stream, without blocking it.

        Raises:
            ClosedError: the session is closed.
        """
        return SpecStats._from_native(self._require().stats())

    def reset_stats(self) -> None:
        """Zero the cumulative statistics.

        Raises:
            ClosedError: the session is closed.
        """
        self._require().reset_stats()

    def print_stats(self) -> str:
        """Log (logger "llamaspec", INFO) and return a summary in the form of upstream's."""
        text = self.stats().summary()
        logger.info("%s", text)
        return text

    def close(self) -> None:
        """Stop a running generation and free both contexts. Idempotent."""
        self._native = None  # a still-running worker keeps what it needs until it has stopped
        super().close()

    def __repr__(self) -> str:
        return f"<llamaspec.MTP n_draft={self._n_draft} model={self._model!r}>"


def _check_every(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InvalidOptionError(f"emit_stats_every must be an int >= 0, got {v!r}")
    return v
