"""N-gram drafting where the answer copies the prompt (code editing) and where it copies nothing.

Cases (SmolLM2-135M Q4_1, the test model, chat template, greedy):
  code-edit  "rename `total` to `acc` in these eight functions" over ~280 tokens of Python: the
             answer mostly copies the prompt
  free-text  a short story prompt: nothing to copy
For each case and thread count: plain decoding (llamaspec.Generator) against each n-gram method with
its default options (llamaspec's defaults, i.e. upstream's), n_draft "auto" and fixed 3, side by side:
every configuration runs once per round, in rotating order, --runs rounds; medians of tokens/s and
of the per-round ratio to plain. Drafted and accepted counts come from Speculative.stats().

Usage: python bench/ngram_code.py [--runs 5] [--threads 1 2] [--tokens 200]
       [--methods ngram-simple ngram-map-k ngram-mod] [--n-draft auto 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Literal

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_decode import smollm2  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

FUNCS = "\n\n".join(
    f"def {name}(items):\n    total = {init}\n    for x in items:\n"
    f"        total = total {op} x\n    return total"
    for name, init, op in [
        ("add_all", 0, "+"), ("mul_all", 1, "*"), ("sub_all", 0, "-"), ("max_all", "float('-inf')", "+ 0 *"),
        ("count_all", 0, "+ 1 +"), ("xor_all", 0, "^"), ("or_all", 0, "|"), ("and_all", -1, "&"),
    ]
)
CASES = {
    "code-edit": "Rename the variable `total` to `acc` in these functions. Reply with the code only.\n\n"
    f"{FUNCS}\n",
    "free-text": "Write a short story about a fox who learns to sail.",
}


def rate(session: llamaspec.Generator | llamaspec.Speculative, prompt: str, n: int) -> float:
    session.generate(messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0)
    assert session.last_stats is not None
    return session.last_stats.tokens_per_second


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--methods", nargs="+", default=["ngram-simple", "ngram-map-k", "ngram-mod"])
    ap.add_argument("--n-draft", nargs="+", default=["auto", "3"])
    ap.add_argument("--cases", nargs="+", default=list(CASES))
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    model = llamaspec.Model(smollm2())
    with llamaspec.Model(smollm2(), vocab_only=True) as vm:
        prompt_tokens = {c: len(vm.tokenize(CASES[c])) for c in args.cases}
    rows = []
    for case in args.cases:
        prompt = CASES[case]
        for threads in args.threads:
            sessions: dict[str, llamaspec.Generator | llamaspec.Speculative] = {
                "plain": llamaspec.Generator(model, n_ctx=2048, n_threads=threads)}
            for m in args.methods:
                for nd in args.n_draft:
                    n_draft: int | Literal["auto"] = "auto" if nd == "auto" else int(nd)
                    sessions[f"{m} {nd}"] = llamaspec.Speculative(
                        model, method=m, n_draft=n_draft, n_ctx=2048, n_threads=threads)
            for s in sessions.values():  # each session's first call: warm-up (and auto's first look)
                rate(s, prompt, args.tokens)
                if isinstance(s, llamaspec.Speculative):
                    s.reset_stats()
            rates: dict[str, list[float]] = {k: [] for k in sessions}
            ratios: dict[str, list[float]] = {k: [] for k in sessions}
            names = list(sessions)
            for i in range(args.runs):
                order = names[i % len(names):] + names[:i % len(names)]
                got = {k: rate(sessions[k], prompt, args.tokens) for k in order}
                for k, v in got.items():
                    rates[k].append(v)
                    ratios[k].append(v / got["plain"])
            for k, s in sessions.items():
                st = s.stats() if isinstance(s, llamaspec.Speculative) else None
                rows.append(dict(case=case, threads=threads, config=k, rate=statistics.median(rates[k]),
                                 ratio=statistics.median(ratios[k]), lo=min(ratios[k]), hi=max(ratios[k]),
                                 drafted=st.drafts_generated / args.runs if st else 0.0,
                                 acc=st.acceptance_rate if st else 0.0))
                last = rows[-1]
                print(f"  {case} t={threads} {k}: {last['rate']:.1f} tok/s, {last['ratio']:.2f}x plain, "
                      f"drafted {last['drafted']:.0f}/call at {last['acc']:.2f}", flush=True)
                s.close()
    model.close()
    lines = [
        f"SmolLM2-135M Q4_1, chat template, greedy, {args.tokens} tokens; prompts: "
        + ", ".join(f"{c} {n} tokens" for c, n in prompt_tokens.items())
        + f"; medians of {args.runs} rounds (every configuration once per round, rotating order); "
        "n-gram methods with their default options.",
        "",
        "| case | threads | configuration | tok/s | **/ plain** (min-max) | drafted per call | acceptance |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = f"**{r['ratio']:.2f}x** ({r['lo']:.2f}-{r['hi']:.2f})"
        lines.append(f"| {r['case']} | {r['threads']} | {r['config']} | {r['rate']:.1f} | {ratio} "
                     f"| {r['drafted']:.0f} | {r['acc']:.2f} |")
    emit_report("ngram_code", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
