"""Several sequences in one speculative session: aggregate and per-sequence tokens/s for n_seq 1, 2, 4,
plain vs speculative, side by side in one run.

Cases:
  mtp    the qwen35 speed fixture with its MTP head (~74% acceptance at n_draft 3)
  ngram  SmolLM2-135M Q4_1 (the test model) with ngram-mod (n_match 8) on prompts that ask to copy a
         list (drafting costs ~nothing: what batching does to the verify alone)

For each case, thread count, n_draft (--n-draft: lengths and/or "auto") and n_seq: the same N prompts
(N = the largest n_seq) are generated greedily, --tokens each, by
  plain       llamaspec.Generator, one prompt after the other (no batched plain decoding exists in
              llamaspec; it is the single-sequence baseline)
  spec n_seq  llamaspec.Speculative(n_seq=k).generate_batch(prompts): k calls at a time, one draft
              call and one target verify per iteration for all of them
aggregate tokens/s = all generated tokens / wall time of the whole set; per-sequence tokens/s = the
median of the calls' own rates ((tokens - 1) / first-to-last-token time). Every configuration is
measured once per run, alternating, --runs runs; medians. Acceptance and passes per verify from
Speculative.stats().

Usage: python bench/multi_seq.py [--runs 3] [--threads 1 2] [--tokens 128] [--n-seq 1 2 4] [--n-draft 3 auto]
       [--cases mtp ngram]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import llamaspec
from llamaspec_fixtures import SPEED, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med  # noqa: E402
from plain_decode import smollm2  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LISTS = [
    "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine",
    "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune, Pluto, Ceres, Eris, Haumea",
    "red, orange, yellow, green, blue, indigo, violet, black, white, grey, brown, pink",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday, January, February, March",
]
PROMPTS = [f"Copy the list exactly, three times.\n{x}\n{x}\n" for x in LISTS]


def cases(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any], list[str]]]:
    """(name, model path, Speculative kwargs, prompts)"""
    out = []
    if "mtp" in args.cases:
        args.fixtures.mkdir(parents=True, exist_ok=True)
        info = write_qwen35_fixture(args.fixtures / "speed-mtp-0.14.gguf", spec=SPEED, mtp_wrong_fraction=0.14)
        with llamaspec.Model(info.path, vocab_only=True) as vm:
            n = len(info.cycle)
            prompts = [vm.detokenize((info.cycle * 2)[i:i + 8]) for i in (0, n // 4, n // 2, 3 * n // 4)]
        out.append(("mtp", info.path, {"method": "mtp"}, prompts))
    if "ngram" in args.cases:
        out.append(("ngram", smollm2(), {"method": "ngram-mod", "ngram_options": {"n_match": 8}}, PROMPTS))
    return out


def plain_set(g: llamaspec.Generator, prompts: list[str], n: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    tokens, rates = 0, []
    for p in prompts:
        g.generate(p, n, temperature=0)
        assert g.last_stats is not None
        tokens += g.last_stats.tokens
        rates.append(g.last_stats.tokens_per_second)
    return tokens / (time.perf_counter() - t0), rates


def spec_set(s: llamaspec.Speculative, prompts: list[str], n: int) -> tuple[float, list[float]]:
    """generate_batch, with the calls' own stats collected from their Done events."""
    rates: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    t0 = time.perf_counter()
    sem = threading.Semaphore(s.n_seq)

    def one(p: str) -> None:
        with sem:
            for ev in s.stream_events(p, n, temperature=0):
                if isinstance(ev, llamaspec.Done):
                    with lock:
                        rates.append(ev.stats.tokens_per_second)
                        tokens[0] += ev.stats.tokens

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens[0] / (time.perf_counter() - t0), rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-seq", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--n-draft", nargs="+", default=["3"], help="fixed lengths and/or auto")
    ap.add_argument("--cases", nargs="+", default=["mtp", "ngram"])
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    rows = []
    for name, path, kw, prompts in cases(args):
        prompts = prompts[:max(args.n_seq)]
        model = llamaspec.Model(path)
        for threads in args.threads:
            plain = llamaspec.Generator(model, n_ctx=1024, n_threads=threads)
            specs = {f"n_draft {nd}, n_seq {k}": llamaspec.Speculative(
                         model, n_draft="auto" if nd == "auto" else int(nd), n_seq=k, n_ctx=1024, n_threads=threads, **kw)
                     for nd in args.n_draft for k in args.n_seq}
            want = [plain.generate(p, args.tokens, temperature=0) for p in prompts]
            for k, s in specs.items():  # warm-up, and a check that batching is lossless here
                got = s.generate_batch(prompts, args.tokens, temperature=0)
                if got != want:
                    print(f"  note: {name} {k}: {sum(a != b for a, b in zip(got, want))} text(s) differ from plain "
                          "(near-ties on the real model; the tests check this)", flush=True)
                s.reset_stats()
            agg: dict[str, list[float]] = {"plain": [], **{k: [] for k in specs}}
            per: dict[str, list[float]] = {key: [] for key in agg}
            for _ in range(args.runs):
                a, r = plain_set(plain, prompts, args.tokens)
                agg["plain"].append(a)
                per["plain"].extend(r)
                for k, s in specs.items():
                    a, r = spec_set(s, prompts, args.tokens)
                    agg[k].append(a)
                    per[k].extend(r)
            for k, s in specs.items():
                st = s.stats()
                rows.append(dict(case=name, threads=threads, config=k, agg=med(agg[k]),
                                 per=statistics.median(per[k]), plain=med(agg["plain"]),
                                 plain_per=statistics.median(per["plain"]), acc=st.acceptance_rate,
                                 seqs_per_pass=st.iterations / st.passes if st.passes else 0.0))
                s.close()
            plain.close()
            for r in rows[-len(specs):]:
                print(f"  {name:>5} t={threads} {r['config']}: aggregate {r['agg']:.0f} tok/s ({r['agg'] / r['plain']:.2f}x plain), "
                      f"per sequence {r['per']:.0f} tok/s, acceptance {r['acc']:.3f}, sequences per pass {r['seqs_per_pass']:.2f}",
                      flush=True)
        model.close()

    lines = [
        f"greedy, {args.tokens} tokens per prompt, {max(args.n_seq)} prompts per set, medians of "
        f"{args.runs} runs (configurations alternate within each run). plain = llamaspec.Generator, the prompts one after "
        "the other; n_seq k = Speculative(n_seq=k).generate_batch-style: k calls at a time sharing each pass. "
        "mtp: qwen35 speed fixture (16 layers, n_embd 512) with its MTP head; ngram: SmolLM2-135M Q4_1, ngram-mod, copy-a-list prompts.",
        "",
        "| case | threads | config | aggregate tok/s | **aggregate / plain** | per-sequence tok/s | per-sequence / plain | "
        "acceptance | sequences per pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['case']} | {r['threads']} | {r['config']} | {r['agg']:.1f} | **{r['agg'] / r['plain']:.2f}x** | "
                     f"{r['per']:.1f} | {r['per'] / r['plain_per']:.2f}x | {r['acc']:.3f} | {r['seqs_per_pass']:.2f} |")
    lines.append("")
    lines.append("plain aggregate tok/s by case and threads: " + ", ".join(
        sorted({f"{r['case']} t={r['threads']}: {r['plain']:.1f}" for r in rows})))
    emit_report("multi-seq", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
