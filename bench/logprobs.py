"""What log-probabilities cost: the same session with and without ``logprobs=True, top_logprobs=5``.

Cases:
  smollm2-plain  SmolLM2-135M Q4_1 (the test model; a 49,152-token vocabulary, so each token's
                 log-softmax and top-5 scan read 49,152 logits), plain decoding, chat template.
  smollm2-draft  the same drafting for itself (a draft model with the same weights), n_draft 4:
                 each verify reads the rows it samples (the accepted drafts and the one after).
  mtp            the MTP speed fixture at 100% acceptance (speed-mtp-0.0), n_draft 3 (a 260-token
                 vocabulary: what is left is the per-token bookkeeping and the Python objects).
Greedy, so both sides generate the same tokens. Each call is consumed through stream_events (the
TopLogprob objects are built, as a user would get them) and timed by the consumer from the first
token to the last. Every configuration runs once per round, in rotating order, --runs rounds;
medians of tokens/s and of the per-round ratios. The goal (issue 18): with logprobs >= 0.95x without.

Usage: python bench/logprobs.py [--runs 5] [--threads 1 2] [--tokens 128]
       [--cases smollm2-plain smollm2-draft mtp] [--top 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive import mtp_fixture  # noqa: E402
from plain_decode import smollm2  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ASK = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]


def call(session: llamaspec.Generator | llamaspec.Speculative, prompt: Any, n: int,
         options: dict[str, Any]) -> tuple[float, int]:
    """(tokens/s from the first token to the last, as the consumer sees them; tokens) of one call."""
    kw: dict[str, Any] = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    t_first = t_last = 0.0
    count = 0
    for ev in session.stream_events(max_tokens=n, temperature=0, **kw, **options):
        if isinstance(ev, llamaspec.Token):
            t_last = time.perf_counter()
            if count == 0:
                t_first = t_last
            count += 1
    return (count - 1) / (t_last - t_first) if count > 1 else 0.0, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--cases", nargs="+", default=["smollm2-plain", "smollm2-draft", "mtp"])
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    probs = {"logprobs": True, "top_logprobs": args.top}
    rows = []
    for case in args.cases:
        prompt: Any = ASK
        if case == "mtp":
            info, prompt = mtp_fixture(args.fixtures, 0.0)
            model_path = info.path
        else:
            model_path = smollm2()
        model = llamaspec.Model(model_path)
        for threads in args.threads:
            common = {"n_ctx": 1024, "n_threads": threads}
            session: llamaspec.Generator | llamaspec.Speculative
            if case == "mtp":
                session = llamaspec.MTP(model, n_draft=3, **common)
            elif case == "smollm2-draft":
                session = llamaspec.Speculative(model, method="draft", draft_model=model_path, n_draft=4,
                                                **common)
            else:
                session = llamaspec.Generator(model, **common)
            configs: dict[str, dict[str, Any]] = {"off": {}, f"top_logprobs={args.top}": probs}
            for c in configs.values():  # warm-up
                call(session, prompt, args.tokens, c)
            rates: dict[str, list[float]] = {k: [] for k in configs}
            tokens: dict[str, int] = {}
            names = list(configs)
            for i in range(args.runs):
                for k in names[i % 2:] + names[:i % 2]:
                    r, n = call(session, prompt, args.tokens, configs[k])
                    rates[k].append(r)
                    tokens[k] = n
            ratio = [a / b for a, b in zip(rates[names[1]], rates["off"])]
            rows.append(dict(case=case, threads=threads, tokens=tokens[names[1]],
                             off=statistics.median(rates["off"]), on=statistics.median(rates[names[1]]),
                             ratio=(statistics.median(ratio), min(ratio), max(ratio))))
            r = rows[-1]
            print(f"  {case} t={threads}: {r['off']:.1f} -> {r['on']:.1f} tok/s, {r['ratio'][0]:.3f}x",
                  flush=True)
            session.close()
        model.close()
    lines = [
        f"Greedy, at most {args.tokens} tokens, consumed through stream_events; medians of {args.runs} "
        f"rounds (both sides once per round, alternating order). With: logprobs=True, "
        f"top_logprobs={args.top} (raw logits' log-softmax).",
        "",
        "| case | threads | tokens | tok/s without | tok/s with | **with / without** (min-max) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        v = r["ratio"]
        lines.append(f"| {r['case']} | {r['threads']} | {r['tokens']} | {r['off']:.1f} | {r['on']:.1f} "
                     f"| **{v[0]:.3f}x** ({v[1]:.3f}-{v[2]:.3f}) |")
    emit_report("logprobs", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
