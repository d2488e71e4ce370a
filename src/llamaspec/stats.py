"""Statistics of a session's generation (plain or speculative), cumulative and readable from any
thread: ``SpecStats``, with one ``StageStats`` per stage of a speculative chain.

The native counters are listed once, in src/native/stats.h; every scalar counter of that list that
is also a field here is copied by name (``_from_native``), the rest are derived.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["PromptCacheInfo", "PromptCacheRamInfo", "SpecStats", "StageStats"]

#: The timers of ``timing_us`` (native counters ``<name>_us``).
_TIMES = ("draft", "verify", "sample", "prefill", "total")
#: Native counters that are not fields but feed derived ones (tokens_per_second, timing_us).
_NATIVE_INPUTS = frozenset({"rate_tokens", "window_s", *(f"{k}_us" for k in _TIMES)})


@dataclass(frozen=True, slots=True)
class PromptCacheInfo:
    """What one sequence's memory holds for the next call (the prompt cache, README).

    Attributes:
        tokens: tokens at the start of the sequence that a call with the same prefix reuses.
        checkpoints: saved states of what cannot be cut back (the recurrent state of hybrid models,
            a drafter's hidden row), where a prompt that diverges earlier restarts.
        checkpoint_bytes: host memory those checkpoints take.
    """

    tokens: int
    checkpoints: int
    checkpoint_bytes: int


@dataclass(frozen=True, slots=True)
class PromptCacheRamInfo:
    """The host-memory prompt cache (``prompt_cache_mb``): prompts saved from sequences that a call
    reused for another prompt, to be loaded when a prompt that shares their start comes back.

    Attributes:
        prompts: saved prompts.
        tokens: their tokens, all together.
        bytes: host memory they take (their states, checkpoints included).
        limit_bytes: the budget; 0 when the cache is off, None when it has no limit.
    """

    prompts: int
    tokens: int
    bytes: int
    limit_bytes: int | None


@dataclass(frozen=True, slots=True)
class StageStats:
    """Statistics of one stage of a chain (one upstream method), cumulative like SpecStats.

    Attributes:
        method: the upstream method name, e.g. "ngram-mod".
        drafts: drafts this stage produced (verify passes it drafted for).
        drafts_generated: draft tokens it proposed.
        drafts_accepted: of those, tokens the target accepted.
        acceptance_rate: drafts_accepted / drafts_generated (0.0 when it proposed nothing).
        draft_us: microseconds inside its draft calls, including the calls that found nothing.
        accepted_per_position: how often its draft position i was accepted (length n_draft).
        drafted_per_position: how often its draft reached position i (length n_draft).
    """

    method: str
    drafts: int
    drafts_generated: int
    drafts_accepted: int
    acceptance_rate: float
    draft_us: float
    accepted_per_position: tuple[int, ...]
    drafted_per_position: tuple[int, ...]

    @classmethod
    def _from_native(cls, d: dict[str, Any]) -> StageStats:
        gen, acc = int(d["drafts_generated"]), int(d["drafts_accepted"])
        return cls(
            method=str(d["method"]),
            drafts=int(d["drafts"]),
            drafts_generated=gen,
            drafts_accepted=acc,
            acceptance_rate=acc / gen if gen else 0.0,
            draft_us=float(d["draft_us"]),
            accepted_per_position=tuple(int(x) for x in d["accepted_per_position"]),
            drafted_per_position=tuple(int(x) for x in d["drafted_per_position"]),
        )


@dataclass(frozen=True, slots=True)
class SpecStats:
    """Cumulative statistics of a session (all calls since creation or reset_stats()); for plain
    generation (``Generator``) the drafting figures stay 0 and n_draft is 0.

    Every snapshot is internally consistent: the counters (totals and stages) were copied together.

    Attributes:
        iterations: verifies (the prompt pass is not one); on a multi-sequence session, summed
            over the sequences.
        passes: target verify passes; one pass verifies every sequence that is decoding, so with
            several sequences passes < iterations (with one, they are equal).
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
        stages: one StageStats per stage, in the order the stages are tried; their drafts,
            drafts_generated and drafts_accepted add up to the totals.
        draft_length_histogram: verifies by the draft length asked for, index 0..n_draft (0: a
            plain step; the last tokens of a call ask for less than the rest).
        adaptive: the session chooses the length per verify (``n_draft="auto"``); n_draft is then
            the maximum.
        shadow_drafts: with ``n_draft="auto"``, plain steps that also asked the drafter for a token
            without verifying it (to measure acceptance at no verify cost); not in drafts_generated.
        shadow_accepted: shadow drafts whose token equalled the one the plain step produced.
        cached_tokens: prompt tokens reused from a sequence's memory instead of decoded (the
            prompt cache; see GenerationStats.cached_tokens).
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
    stages: tuple[StageStats, ...] = ()
    draft_length_histogram: tuple[int, ...] = ()
    adaptive: bool = False
    shadow_drafts: int = 0
    shadow_accepted: int = 0
    passes: int = 0
    cached_tokens: int = 0

    @classmethod
    def _from_native(cls, d: dict[str, Any]) -> SpecStats:
        # the native integer counters that are fields here, by name; the rest are derived below
        names = {f.name for f in fields(cls)}
        counters = {k: int(v) for k, v in d.items()
                    if k in names and isinstance(v, int) and not isinstance(v, bool)}
        gen, acc, it = counters["drafts_generated"], counters["drafts_accepted"], counters["iterations"]
        window = float(d["window_s"])
        return cls(
            **counters,
            acceptance_rate=acc / gen if gen else 0.0,
            tokens_per_second=int(d["rate_tokens"]) / window if window > 0 else 0.0,
            timing_us={k: float(d[f"{k}_us"]) for k in _TIMES},
            mean_accepted_length=acc / it + 1.0 if it else 0.0,
            accepted_per_position=tuple(int(x) for x in d["accepted_per_position"]),
            drafted_per_position=tuple(int(x) for x in d["drafted_per_position"]),
            stages=tuple(StageStats._from_native(sd) for sd in d["stages"]),
            draft_length_histogram=tuple(int(x) for x in d["draft_length_histogram"]),
            adaptive=bool(d["adaptive"]),
        )

    @property
    def mean_draft_length(self) -> float:
        """The mean draft length asked for per verify (0.0 before the first)."""
        n = sum(self.draft_length_histogram)
        return sum(k * c for k, c in enumerate(self.draft_length_histogram)) / n if n else 0.0

    @property
    def methods(self) -> tuple[str, ...]:
        """The stages' method names, in the order they are tried."""
        return tuple(st.method for st in self.stages)

    def summary(self, method: str | None = None) -> str:
        """A summary in the form of upstream's speculative statistics, built from our counters: one
        line per stage when stages are chained, then the totals.

        Args:
            method: the label of the totals line (default: the stages' names joined by ",").
        """
        label = method if method is not None else (",".join(self.methods) or "speculative")
        lines = []
        if len(self.stages) > 1:
            for st in self.stages:
                rates = ", ".join(f"{a / st.drafts:.3f}" if st.drafts else "0.000" for a in st.accepted_per_position)
                mean = st.drafts_accepted / st.drafts + 1.0 if st.drafts else 0.0
                lines.append(
                    f"statistics {st.method:>16}: #drafts = {st.drafts}, #gen tokens = {st.drafts_generated}, "
                    f"#acc tokens = {st.drafts_accepted}, acceptance = {100 * st.acceptance_rate:.2f}%, "
                    f"#mean acc len = {mean:.2f}, #acc rate/pos = ({rates}), dur(draft) = {st.draft_us / 1e3:.3f} ms"
                )
        rates = ", ".join(f"{a / self.iterations:.3f}" if self.iterations else "0.000"
                          for a in self.accepted_per_position)
        t = self.timing_us
        lines.append(
            f"statistics {label:>16}: #iterations = {self.iterations}, #gen tokens = {self.drafts_generated}, "
            f"#acc tokens = {self.drafts_accepted}, acceptance = {100 * self.acceptance_rate:.2f}%, "
            f"#mean acc len = {self.mean_accepted_length:.2f}, #acc rate/pos = ({rates}), "
            f"#emitted = {self.tokens_emitted}, {self.tokens_per_second:.2f} tok/s, "
            f"dur(draft,verify,sample,prefill,total) = {t['draft'] / 1e3:.3f}, {t['verify'] / 1e3:.3f}, "
            f"{t['sample'] / 1e3:.3f}, {t['prefill'] / 1e3:.3f}, {t['total'] / 1e3:.3f} ms"
        )
        return "\n".join(lines)
