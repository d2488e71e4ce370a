"""What a grammar costs a speculative session: the same session with and without a constraint.

Cases:
  smollm2-draft  SmolLM2-135M Q4_1 (the test model) drafting for itself (a draft model with the same
                 weights), n_draft 4, chat template, greedy; the constraint is a JSON schema (a list
                 of countries with capital and population). The text differs between the two sides
                 (the schema shapes it), so their acceptance is reported next to the rates.
  smollm2-ngram  the same with ngram-simple.
  mtp            the MTP speed fixture at 100% acceptance (speed-mtp-0.0), n_draft 3; the constraint
                 is a GBNF grammar that admits every printable character, so the text and the
                 acceptance are the same on both sides: what is left is the grammar's own cost
                 (checking the sampled token at every verified row, and at each rejection).
For each case and thread count every configuration (plain, plain + constraint, speculative,
speculative + constraint) runs once per round, in rotating order, --runs rounds; medians of
tokens/s and of the per-round ratios. The goal (issue 18): speculative + constraint >= 0.95x
speculative.

Usage: python bench/grammar.py [--runs 5] [--threads 1 2] [--tokens 160]
       [--cases smollm2-draft smollm2-ngram mtp]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive import mtp_fixture  # noqa: E402
from plain_decode import smollm2  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COUNTRIES = {
    "type": "array", "minItems": 5, "maxItems": 5,
    "items": {"type": "object", "additionalProperties": False,
              "required": ["country", "capital", "population"],
              "properties": {"country": {"type": "string", "maxLength": 30},
                             "capital": {"type": "string", "maxLength": 30},
                             "population": {"type": "integer", "minimum": 0}}},
}
ASK = [{"role": "user", "content": "List five countries with their capital and population, as JSON."}]
PRINTABLE = "root ::= [ -~]*\n"


def call(session: llamaspec.Generator | llamaspec.Speculative, prompt: Any, n: int,
         constraint: dict[str, Any]) -> tuple[float, int]:
    """(tokens/s, tokens) of one greedy call."""
    kw: dict[str, Any] = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    session.generate(max_tokens=n, temperature=0, **kw, **constraint)
    st = session.last_stats
    assert st is not None
    return st.tokens_per_second, st.tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--cases", nargs="+", default=["smollm2-draft", "smollm2-ngram", "mtp"])
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    rows = []
    for case in args.cases:
        prompt: Any = ASK
        if case == "mtp":
            info, prompt = mtp_fixture(args.fixtures, 0.0)  # the prompt: the first 8 tokens of its cycle
            model_path = info.path
            constraint: dict[str, Any] = {"grammar": PRINTABLE}
        else:
            model_path = smollm2()
            constraint = {"json_schema": COUNTRIES}
        model = llamaspec.Model(model_path)
        for threads in args.threads:
            common = {"n_ctx": 1024, "n_threads": threads}
            if case == "mtp":
                spec = llamaspec.MTP(model, n_draft=3, **common)
            elif case == "smollm2-draft":
                spec = llamaspec.Speculative(model, method="draft", draft_model=model_path, n_draft=4,
                                             **common)
            else:
                spec = llamaspec.Speculative(model, method="ngram-simple", n_draft=4, **common)
            plain = llamaspec.Generator(model, **common)
            configs = {"plain": (plain, {}), "plain + constraint": (plain, constraint),
                       "speculative": (spec, {}), "speculative + constraint": (spec, constraint)}
            for s, c in configs.values():  # warm-up
                call(s, prompt, args.tokens, c)
            rates: dict[str, list[float]] = {k: [] for k in configs}
            tokens: dict[str, int] = {}
            acc: dict[str, list[float]] = {k: [] for k in configs}
            names = list(configs)
            for i in range(args.runs):
                for k in names[i % len(names):] + names[:i % len(names)]:
                    s, c = configs[k]
                    before = spec.stats()
                    r, n = call(s, prompt, args.tokens, c)
                    rates[k].append(r)
                    tokens[k] = n
                    if s is spec:
                        after = spec.stats()
                        drafted = after.drafts_generated - before.drafts_generated
                        acc[k].append((after.drafts_accepted - before.drafts_accepted) / max(1, drafted))
            ratio = [a / b for a, b in zip(rates["speculative + constraint"], rates["speculative"])]
            for k in names:
                rows.append(dict(case=case, threads=threads, config=k, rate=statistics.median(rates[k]),
                                 plain=statistics.median(a / b for a, b in zip(rates[k], rates["plain"])),
                                 tokens=tokens[k], acc=statistics.median(acc[k]) if acc[k] else None,
                                 vs_spec=(statistics.median(ratio), min(ratio), max(ratio))
                                 if k == "speculative + constraint" else None))
                r = rows[-1]
                print(f"  {case} t={threads} {k}: {r['rate']:.1f} tok/s, {r['plain']:.2f}x plain", flush=True)
            spec.close()
            plain.close()
        model.close()
    lines = [
        f"Greedy, at most {args.tokens} tokens; medians of {args.runs} rounds (every configuration once per "
        "round, rotating order). Constraint: SmolLM2 cases a JSON schema (5 countries with capital and "
        "population), mtp a GBNF grammar of every printable character (the text is unchanged).",
        "",
        "| case | threads | configuration | tokens | tok/s | / plain | acceptance "
        "| **constrained / unconstrained speculative** (min-max) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        v = r["vs_spec"]
        vs = f"**{v[0]:.3f}x** ({v[1]:.3f}-{v[2]:.3f})" if v else ""
        a = f"{r['acc']:.2f}" if r["acc"] is not None else ""
        lines.append(f"| {r['case']} | {r['threads']} | {r['config']} | {r['tokens']} | {r['rate']:.1f} "
                     f"| {r['plain']:.2f}x | {a} | {vs} |")
    emit_report("grammar", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
