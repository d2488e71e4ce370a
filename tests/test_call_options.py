"""Per-call options beside sampling: ``draft_max`` (this call's longest draft) and ``prompt_progress``
(PromptProgress events while the prompt is decoded)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import llamaspec
from llamaspec import InvalidOptionError, PromptProgress, Token

pytestmark = pytest.mark.real_model

PROMPT = "Here is a list of fruits: apple, banana, cherry. Repeat the list three times:"


def greedy(session: Any, **kw: Any) -> tuple[list[int], llamaspec.GenerationStats]:
    events = list(session.stream_events(PROMPT, 40, temperature=0, **kw))
    return [e.id for e in events if isinstance(e, Token)], events[-1].stats


def test_draft_max_changes_speed_not_output(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol, n_ctx=512, n_threads=2) as plain:
        want, _ = greedy(plain)
        assert greedy(plain, draft_max=0)[0] == want  # a plain session has nothing to cap
    kw: dict[str, Any] = {"method": "draft", "draft_model": smol, "n_draft": 4, "n_ctx": 512, "n_threads": 2}
    with llamaspec.Speculative(smol, **kw) as spec:
        for cap in (None, 0, 1, 2, 4, 9):
            ids, st = greedy(spec, draft_max=cap)
            assert ids == want, cap
            limit = 4 if cap is None else min(cap, 4)
            assert st.drafts_generated <= limit * st.iterations, (cap, st)
            if limit == 0:
                # one verify per token after the first, which the prompt's decode samples (ADR 0014)
                assert st.drafts_generated == 0 and st.iterations >= st.tokens - 1
            else:
                assert st.drafts_accepted > 0, cap
        seeded = [spec.generate(PROMPT, 24, temperature=0.8, seed=3, draft_max=c) for c in (0, 3)]
        assert seeded[0] == seeded[1]


def test_p_min_per_call_changes_speed_not_output(smol: llamaspec.Model) -> None:
    """A session with p_min 0 drafts every token; a call with p_min 1.0 stops a draft at the first
    token the drafter is not certain of (patch 0007). The text is the same."""
    kw: dict[str, Any] = {"method": "draft", "draft_model": smol, "n_draft": 4, "n_ctx": 512, "n_threads": 2}
    with llamaspec.Speculative(smol, **kw) as spec:
        want, free = greedy(spec)
        ids, strict = greedy(spec, p_min=1.0)
        assert ids == want
        assert strict.drafts_generated < free.drafts_generated / 2, (strict, free)
        ids, same = greedy(spec, p_min=0.0)
        assert ids == want and same.drafts_generated == free.drafts_generated
    with llamaspec.Speculative(smol, p_min=1.0, **kw) as strict_session:  # a call can also loosen it
        ids, loose = greedy(strict_session, p_min=0.0)
        assert ids == want and loose.drafts_generated == free.drafts_generated


def test_prompt_progress_events(smol: llamaspec.Model) -> None:
    spec: dict[str, Any] = {"method": "draft", "draft_model": smol}
    for cls, kw in ((llamaspec.Generator, {}), (llamaspec.Speculative, spec)):
        with cls(smol, n_ctx=512, n_batch=16, n_threads=2, **kw) as s:
            n = len(smol.tokenize(PROMPT, parse_special=True))
            events = list(s.stream_events(PROMPT, 4, temperature=0, prompt_progress=True))
            prog = [e for e in events if isinstance(e, PromptProgress)]
            first_token = next(i for i, e in enumerate(events) if isinstance(e, Token))
            assert (
                all(isinstance(e, PromptProgress) for e in events[: len(prog)]) and len(prog) <= first_token
            )
            assert prog[0].processed == prog[0].cached == 0 and prog[0].prompt_time == 0.0
            assert [p.processed for p in prog] == sorted({p.processed for p in prog})
            assert prog[-1].processed == n
            assert all(p.total == n for p in prog) and len(prog) >= 1 + n // 16
            assert [p.prompt_time for p in prog] == sorted(p.prompt_time for p in prog)
            # the same tokens with and without progress events; none unless asked
            plain = list(s.stream_events(PROMPT, 4, temperature=0))
            assert not any(isinstance(e, PromptProgress) for e in plain)
            assert [e for e in plain if isinstance(e, Token)] == [e for e in events if isinstance(e, Token)]

            async def count() -> int:
                return sum(
                    [
                        isinstance(e, PromptProgress)
                        async for e in s.astream_events(PROMPT, 2, temperature=0, prompt_progress=True,
                                                        cache_prompt=False)
                    ]
                )

            assert asyncio.run(count()) == len(prog)
            # the prompt again: all of it but its last token comes from the cache, which the first
            # event says (processed == cached, as llama-server's first report)
            again = [e for e in s.stream_events(PROMPT, 2, temperature=0, prompt_progress=True)
                     if isinstance(e, PromptProgress)]
            assert [(p.processed, p.cached) for p in again] == [(n - 1, n - 1), (n, n - 1)]


def test_call_options_are_checked(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol, n_ctx=256, n_threads=1) as g:
        for bad in (-1, 1.5, "2", True):
            with pytest.raises(InvalidOptionError, match="draft_max"):
                g.generate("hi", 2, draft_max=bad)
        for bad_p in (-0.1, 1.5, float("nan"), "0.5", True):
            with pytest.raises(InvalidOptionError, match="p_min"):
                g.generate("hi", 2, p_min=bad_p)
        with pytest.raises(InvalidOptionError, match="prompt_progress"):
            list(g.stream_events("hi", 2, prompt_progress=1))  # type: ignore[arg-type]
