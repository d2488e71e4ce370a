"""`llamaspec bench MODEL`: plain decoding and speculative decoding with each drafter and draft length
asked for, side by side in one run, as ratios (like llama-bench: the machine's drift hits every side alike).

Every configuration is one session, created once and warmed up by an untimed call; then each of
``-r`` rounds times one greedy call per configuration, the order rotating from round to round.
The table gives the median tokens/s over the rounds, its ratio to plain decoding's, the acceptance
and the mean draft length, and whether the text equals plain decoding's (it does, token for token,
unless a real model's batched kernels round a near-tie the other way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from ._cmd_run import n_ctx_for, prompt_ids
from ._flags import (
    add_context_arguments,
    add_model_arguments,
    add_n_predict_argument,
    add_speculative_arguments,
    check_context_arguments,
    context_options,
    model_options,
    model_path,
)
from ._plot import bench_svg
from ._terminal import LoadBar, is_terminal
from .errors import InvalidOptionError
from .generator import Generator
from .model import Model
from .speculative import Speculative

DEFAULT_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `llamaspec bench`."""
    add_model_arguments(p, "to measure")
    w = p.add_argument_group("workload")
    w.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="the prompt (default: a short story)")
    w.add_argument("-f", "--file", help="read the prompt from this file")
    w.add_argument("--system", help="a system message (with the chat template)")
    w.add_argument("--raw", action="store_true", help="the prompt as it is, without the chat template")
    add_n_predict_argument(w, 128, "tokens generated per call (default 128)")
    w.add_argument("-r", "--repetitions", dest="runs", type=int, default=3,
                   help="timed calls per configuration; the table shows medians (default 3)")
    add_speculative_arguments(p, several=True)
    eng = p.add_argument_group("engine")
    add_context_arguments(eng, "context size (default 0: the prompt and -n, rounded up)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="OUT.svg",
                   help="also write the results as an SVG (tokens/s and acceptance per draft length, method)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


@dataclass
class Side:
    """One configuration: plain decoding or one drafter at one draft length."""

    label: str
    session: Generator | Speculative
    n_draft: int | Literal["auto"]
    rates: list[float] = field(default_factory=list)
    prompt_rates: list[float] = field(default_factory=list)
    text: str = ""

    def row(self, plain: float) -> dict[str, Any]:
        rate = statistics.median(self.rates)
        out: dict[str, Any] = {
            "config": self.label,
            "n_draft": self.n_draft,
            "tokens_per_second": rate,
            "vs_plain": rate / plain if plain > 0 else 0.0,
            "prompt_tokens_per_second": statistics.median(self.prompt_rates),
            "runs": list(self.rates),
        }
        if isinstance(self.session, Speculative):
            st = self.session.stats()
            out.update(acceptance_rate=st.acceptance_rate, mean_draft_length=st.mean_draft_length)
        return out


def _progress(text: str) -> None:
    if is_terminal(sys.stderr):
        sys.stderr.write(f"\r\x1b[2K{text}")
        sys.stderr.flush()


def bench(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """`llamaspec bench`; returns the exit code."""
    if a.n_predict < 1:
        p.error(f"-n/--n-predict must be >= 1, got {a.n_predict}")
    if a.runs < 1:
        p.error(f"-r/--repetitions must be >= 1, got {a.runs}")
    check_context_arguments(p, a)
    plot_dir = os.path.dirname(os.path.abspath(a.plot)) if a.plot is not None else None
    if plot_dir is not None and not os.path.isdir(plot_dir):
        p.error(f"--plot: no such directory: {plot_dir}")
    if a.file is not None:
        with open(a.file, encoding="utf-8") as f:
            a.prompt = f.read()
    path = model_path(p, a)  # last: -hf may download
    with Model(path, progress=LoadBar(path), **model_options(a)) as model:
        default = "mtp" if model.has_mtp else ("draft" if a.draft_model else None)
        methods = [m for m in (a.methods or [default]) if m not in (None, "none")]
        if not methods:
            raise InvalidOptionError(f"{path} has no MTP layers: name a drafter (--method ngram-mod, "
                                     "-md DRAFT.gguf, ...) to compare with plain decoding")
        ids = prompt_ids(model, a.prompt, a)
        n_ctx = a.n_ctx or min(n_ctx_for(model, 0), (len(ids) + a.n_predict + 64 + 255) // 256 * 256)
        opts: dict[str, Any] = dict(context_options(a))
        sides = [Side("plain", Generator(model, n_ctx=n_ctx, **opts), 0)]
        try:
            for method in methods:
                for n in a.n_drafts:
                    if n == 0:
                        continue  # plain decoding is always there
                    spec = Speculative(model, method=method.split(","), n_draft=n, draft_model=a.draft_model,
                                       n_draft_min=a.n_draft_min, p_min=a.p_min, n_ctx=n_ctx, **opts)
                    sides.append(Side(f"{method} {n}", spec, n))
            return _measure(a, model, methods, sides, ids)
        finally:
            for s in sides:
                s.session.close()


def _measure(a: argparse.Namespace, model: Model, methods: list[str], sides: list[Side],
             ids: list[int]) -> int:
    for s in sides:  # warm-up: graphs, caches, and what an auto session learns on its first call
        _progress(f"warming up: {s.label}")
        s.text = s.session.generate(ids, a.n_predict, temperature=0, cache_prompt=False)
    for r in range(a.runs):
        order = sides[r % len(sides):] + sides[: r % len(sides)]
        for s in order:
            _progress(f"round {r + 1}/{a.runs}: {s.label}")
            s.session.generate(ids, a.n_predict, temperature=0, cache_prompt=False)
            st = s.session.last_stats
            assert st is not None
            s.rates.append(st.tokens_per_second)
            s.prompt_rates.append(st.prompt_tokens / st.prefill_time if st.prefill_time > 0 else 0.0)
    _progress("")
    plain = statistics.median(sides[0].rates)
    rows = [s.row(plain) for s in sides]
    for s, row in zip(sides, rows):
        row["same_text_as_plain"] = s.text == sides[0].text
    if a.plot is not None:
        svg = bench_svg(rows, os.path.basename(model.path),
                        f"{model.description}; prompt {len(ids)} tokens, {a.n_predict} generated, greedy; "
                        f"medians of {a.runs} rounds")
        with open(a.plot, "w", encoding="utf-8") as f:
            f.write(svg)
    if a.json:
        json.dump({"model": model.path, "methods": methods, "prompt_tokens": len(ids), "tokens": a.n_predict,
                   "runs": a.runs, "rows": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{model.path}: {model.description}; prompt {len(ids)} tokens, {a.n_predict} generated, greedy; "
          f"medians of {a.runs} rounds")
    header = ["config", "tok/s", "x plain", "acceptance", "mean length", "prompt tok/s", "same text"]
    table = [header]
    for row in rows:
        table.append([
            row["config"],
            f"{row['tokens_per_second']:.1f}",
            f"{row['vs_plain']:.2f}x",
            f"{row['acceptance_rate']:.0%}" if "acceptance_rate" in row else "-",
            f"{row['mean_draft_length']:.2f}" if "mean_draft_length" in row else "-",
            f"{row['prompt_tokens_per_second']:.0f}",
            "yes" if row["same_text_as_plain"] else "no",
        ])
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    for i, cells in enumerate(table):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0
