"""Adaptive draft length: fixed lengths 0..8 vs n_draft="auto", side by side in one run.

Cases:
  MTP on the speed fixture built for 100%, ~75% (n_draft 3) and 0% acceptance (the cycle prompt);
  changing (not in the default --cases): MTP on the speed fixture whose cycle of 95 tokens has three
  stretches: 32 tokens at 100% acceptance, 32 at 0%, 31 at ~75% (every 7th draft wrong), so the
  acceptance changes every ~32 tokens as the output walks the cycle;
  ngram-mod on SmolLM2 with a mixed text: a prompt that asks to repeat a list (drafting pays while
  the list is copied), then free text once the list is done;
  self-draft (not in the default --cases): SmolLM2 drafting for itself, the same prompt: every draft
  is accepted, yet a draft costs what a target step does, so plain decoding is best.
Length 0 is plain decoding (llamaspec.Generator). For each case and thread count: greedy tokens/s,
medians of --runs runs; every run measures every length back to back (so drifts hit all alike);
auto's acceptance and mean chosen length come from Speculative.stats(). Like each fixed length, auto
is one session, created once: its first (untimed, learning from nothing) call is reported apart.

Usage: python bench/adaptive.py [--runs 5] [--threads 1] [--tokens 256] [--lengths 0 1 2 3 4 5 6 7 8]
       [--cases 100% ~75% 0% changing mixed self-draft]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import llamaspec
from llamaspec_fixtures import SPEED, FixtureInfo, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med, ours_rate  # noqa: E402
from plain_decode import smollm2  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LEVELS = {"100%": 0.0, "~75%": 0.14, "0%": 1.0}
MIXED = (
    "Copy this list twice, then write a short story about a fox.\n"
    "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine\n"
)


CHANGING = [*range(32, 64), *range(64, 95, 7)]  # cycle positions whose MTP draft is wrong


def mtp_fixture(directory: Path, wrong: float | list[int]) -> tuple[FixtureInfo, str]:
    """The MTP speed fixture with mtp_wrong_fraction ``wrong`` (or, given a list, those cycle
    positions wrong; written into ``directory``) and the prompt the adaptive benches use on it: the
    first 8 tokens of its cycle, as text."""
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(wrong, list):
        info = write_qwen35_fixture(directory / "speed-mtp-changing.gguf", spec=SPEED,
                                    mtp_wrong_positions=wrong)
    else:
        info = write_qwen35_fixture(directory / f"speed-mtp-{wrong}.gguf", spec=SPEED,
                                    mtp_wrong_fraction=wrong)
    with llamaspec.Model(info.path, vocab_only=True) as vm:
        return info, vm.detokenize(info.cycle[:8])


def cases(args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(name, model path, prompt, Speculative kwargs)"""
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    for level, wrong in LEVELS.items():
        if level in args.cases:
            info, prompt = mtp_fixture(args.fixtures, wrong)
            out.append((level, info.path, prompt, {"method": "mtp"}))
    if "changing" in args.cases:
        info, prompt = mtp_fixture(args.fixtures, CHANGING)
        out.append(("changing", info.path, prompt, {"method": "mtp"}))
    if "mixed" in args.cases:
        out.append(("mixed", smollm2(), MIXED, {"method": "ngram-mod", "ngram_options": {"n_match": 8}}))
    if "self-draft" in args.cases:  # a drafter as dear as its target: it cannot pay, whatever it accepts
        out.append(("self-draft", smollm2(), MIXED, {"method": "draft", "draft_model": smollm2()}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--lengths", type=int, nargs="+", default=list(range(9)))
    ap.add_argument("--cases", nargs="+", default=[*LEVELS, "mixed"])
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    rows = []
    for name, path, prompt, kw in cases(args):
        model = llamaspec.Model(path)
        for threads in args.threads:
            sessions: dict[str, llamaspec.Generator | llamaspec.Speculative] = {}
            for n in args.lengths:
                sessions[str(n)] = (llamaspec.Generator(model, n_ctx=1024, n_threads=threads) if n == 0 else
                                    llamaspec.Speculative(model, n_draft=n, n_ctx=1024, n_threads=threads, **kw))
            want = sessions[str(args.lengths[0])].generate(prompt, args.tokens, temperature=0)
            # auto is one session too, like every fixed length: what it learns carries over between
            # calls (ADR 0009); its first call (learning from nothing) is reported separately
            auto = llamaspec.Speculative(model, n_draft="auto", n_ctx=1024, n_threads=threads, **kw)
            text = auto.generate(prompt, args.tokens, temperature=0)
            assert text == want or name == "mixed", name  # SmolLM2: near-ties are the tests' business
            assert auto.last_stats is not None
            first_call = auto.last_stats.tokens_per_second
            auto.reset_stats()
            rates: dict[str, list[float]] = {k: [] for k in [*sessions, "auto"]}
            for _ in range(args.runs):
                for k, s in [*sessions.items(), ("auto", auto)]:
                    rates[k].append(ours_rate(s, prompt, args.tokens))
            st = auto.stats()
            acc, mean_len, hist = st.acceptance_rate, st.mean_draft_length, st.draft_length_histogram
            shadows = f"{st.shadow_accepted}/{st.shadow_drafts}"
            auto.close()
            for s in sessions.values():
                s.close()
            meds = {k: med(v) for k, v in rates.items()}
            fixed = {k: v for k, v in meds.items() if k != "auto"}
            best_k = max(fixed, key=lambda k: fixed[k])
            row = dict(case=name, threads=threads, meds=meds, best=best_k, acc=acc, mean_len=mean_len, hist=hist,
                       first=first_call, shadows=shadows)
            rows.append(row)
            print(f"  {name:>5} t={threads}: " + "  ".join(f"{k}:{v:.0f}" for k, v in meds.items())
                  + f"  best fixed {best_k}; auto/best {meds['auto'] / fixed[best_k]:.2f}x, auto/plain "
                  f"{meds['auto'] / meds.get('0', float('nan')):.2f}x, mean length {mean_len:.2f}, first call {first_call:.0f}",
                  flush=True)
        model.close()

    lines = [
        f"greedy, {args.tokens} tokens, medians of {args.runs} runs (every length measured back to back in each run); "
        f"MTP cases: qwen35 speed fixture ({SPEED.n_trunk} layers, n_embd {SPEED.n_embd}; changing: "
        "32 cycle tokens at 100%, 32 at 0%, 31 at ~75%); mixed: SmolLM2-135M "
        "Q4_1, ngram-mod (n_match 8), a copy-a-list-then-write prompt. Length 0 = plain decoding.",
        "",
        "| case | threads | " + " | ".join(f"n_draft {k}" for k in args.lengths) + " | **auto** | best fixed "
        "| **auto/best** | **auto/plain** | auto acceptance | auto mean length | auto lengths histogram (timed runs) "
        "| auto shadow drafts (matched/all) | auto first call tok/s (/best) |",
        "| --- | --- | " + " | ".join("---" for _ in args.lengths) + " | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        m = r["meds"]
        plain = m.get("0", float("nan"))
        lines.append(f"| {r['case']} | {r['threads']} | " + " | ".join(f"{m[str(k)]:.1f}" for k in args.lengths)
                     + f" | **{m['auto']:.1f}** | {r['best']} | **{m['auto'] / m[r['best']]:.2f}x** | "
                     f"**{m['auto'] / plain:.2f}x** | {r['acc']:.3f} | {r['mean_len']:.2f} | {list(r['hist'])} | "
                     f"{r['shadows']} | {r['first']:.1f} ({r['first'] / m[r['best']]:.2f}x) |")
    emit_report("adaptive", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
