"""/metrics: Prometheus text format 0.0.4 under llama-server's names (``llamacpp:``), so dashboards made
for llama-server work unchanged, plus ``llamaspec:`` metrics of our own.

The text is written here, not by prometheus-client: that library renames every counter to end in
``_total``, and llama-server exports a counter without it (``llamacpp:n_tokens_max``). The tests parse
this text with prometheus-client's parser (ADR 0016).
"""

from __future__ import annotations

from collections.abc import Callable

from .engine import ServedModel

# (name, type, help, reader): one line per metric; the one place to add one.
# fmt: off
_METRICS: tuple[tuple[str, str, str, Callable[[ServedModel], float]], ...] = (
    ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
     lambda s: s.totals.prompt_tokens),
    ("llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache.",
     lambda s: s.totals.prompt_tokens_cached),
    ("llamacpp:prompt_seconds_total", "counter", "Prompt process time.", lambda s: s.totals.prompt_seconds),
    ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
     lambda s: s.totals.predicted_tokens),
    ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time.",
     lambda s: s.totals.predicted_seconds),
    ("llamacpp:n_decode_total", "counter", "Target decode passes (prompts and generation).",
     lambda s: s.session.stats().passes + s.totals.requests),
    ("llamacpp:n_tokens_max", "counter", "Largest prompt + generated tokens of a request.",
     lambda s: s.totals.n_tokens_max),
    ("llamacpp:spec_decode_num_drafts_total", "counter", "Verify steps of speculative calls.",
     lambda s: s.totals.verify_steps if s.method != "none" else 0),
    ("llamacpp:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.",
     lambda s: s.totals.drafts_generated),
    ("llamacpp:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted by the target.",
     lambda s: s.totals.drafts_accepted),
    ("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
     lambda s: s.totals.prompt_tokens / s.totals.prompt_seconds if s.totals.prompt_seconds else 0.0),
    ("llamacpp:predicted_tokens_seconds", "gauge", "Generation throughput of the last request in tokens/s.",
     lambda s: s.totals.last_predicted_rate),
    ("llamacpp:requests_processing", "gauge", "Number of requests processing.", lambda s: s.processing),
    ("llamacpp:requests_deferred", "gauge", "Requests waiting for a sequence.", lambda s: s.waiting),
    ("llamacpp:n_busy_slots_per_decode", "gauge", "Average sequences decoded per target pass.",
     lambda s: _busy_per_pass(s)),
    ("llamaspec:requests_total", "counter", "Requests completed.", lambda s: s.totals.requests),
    ("llamaspec:spec_acceptance_rate", "gauge", "Accepted / proposed draft tokens since start.",
     lambda s: s.totals.drafts_accepted / s.totals.drafts_generated if s.totals.drafts_generated else 0.0),
)
# fmt: on


def _busy_per_pass(s: ServedModel) -> float:
    st = s.session.stats()
    return st.iterations / st.passes if st.passes else 0.0


def _value(v: float) -> str:
    return repr(float(v))


def metrics_text(s: ServedModel) -> str:
    """The exposition text of every metric."""
    lines = []
    for name, kind, help_, read in _METRICS:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {_value(read(s))}"]
    st = s.session.stats()
    if s.method != "none" and st.accepted_per_position:
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Draft tokens accepted at each draft position.", f"# TYPE {name} counter"]
        lines += [f'{name}{{position="{i}"}} {_value(v)}' for i, v in enumerate(st.accepted_per_position)]
    return "\n".join(lines) + "\n"
