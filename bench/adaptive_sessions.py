"""n_draft="auto" across fresh sessions: how often does a session settle on a poor length?

bench/adaptive.py measures one auto session; where it settles (and so its ratio) varies from session to
session. This creates --sessions fresh auto sessions in turn on one case of bench/adaptive.py (default
~75%: the MTP speed fixture at mtp_wrong_fraction 0.14), lets each learn during one untimed call, then
times --calls calls alternating with a fixed-length session (--fixed, default the best fixed length of
bench/adaptive.py for the case; 0 is plain decoding, llamaspec.Generator), so the machine's drift hits
both alike. Per session: auto/fixed (sum of tokens/s over its calls), mean chosen length, histogram;
then the median, mean and worst session. --control makes the fresh sessions fixed-length ones too
(n_draft --fixed): the spread of identical sessions (memory placement, the machine), against which
the auto sessions' spread is read.

Usage: python bench/adaptive_sessions.py [--case ~75%] [--sessions 12] [--calls 5] [--fixed N] [--tokens 256]
       [--threads 1] [--control]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Literal

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive import LEVELS, cases  # noqa: E402
from mtp_speed import ours_rate  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# bench/adaptive.py's best fixed lengths (1 thread)
BEST_FIXED = {"100%": 8, "~75%": 5, "0%": 0, "changing": 0, "mixed": 7, "self-draft": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--case", default="~75%", choices=[*LEVELS, "changing", "mixed", "self-draft"])
    ap.add_argument("--fixed", type=int, default=None, help="the fixed length (default: the case's best)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--control", action="store_true", help="fresh sessions with n_draft --fixed instead of auto")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    if args.fixed is None:
        args.fixed = BEST_FIXED[args.case]
    args.cases = [args.case]
    _, path, prompt, kw = cases(args)[0]
    model = llamaspec.Model(path)

    def session(n_draft: int | Literal["auto"]) -> llamaspec.Generator | llamaspec.Speculative:
        if n_draft == 0:
            return llamaspec.Generator(model, n_ctx=1024, n_threads=args.threads)
        return llamaspec.Speculative(model, n_draft=n_draft, n_ctx=1024, n_threads=args.threads, **kw)

    fixed = session(args.fixed)
    want = fixed.generate(prompt, args.tokens, temperature=0)
    rows = []
    for i in range(args.sessions):
        with session(args.fixed if args.control else "auto") as auto:
            assert auto.generate(prompt, args.tokens, temperature=0) == want  # its learning call, untimed
            auto.reset_stats()
            mine, theirs = [], []
            for _ in range(args.calls):
                theirs.append(ours_rate(fixed, prompt, args.tokens))
                mine.append(ours_rate(auto, prompt, args.tokens))
            st = auto.stats()  # a Generator's (the control of fixed 0) has only plain steps
            rows.append((sum(mine) / sum(theirs), st.mean_draft_length, list(st.draft_length_histogram)))
        print(f"  session {i}: fresh/fixed {rows[-1][0]:.3f}, mean length {rows[-1][1]:.2f}, lengths {rows[-1][2]}",
              flush=True)
    fixed.close()
    model.close()

    ratios = [r[0] for r in rows]
    lines = [
        f"Case {args.case} of bench/adaptive.py, greedy, {args.tokens} tokens, {args.threads} thread(s); {args.sessions} fresh "
        f"{'control (n_draft ' + str(args.fixed) + ')' if args.control else 'auto'} sessions, each after one untimed "
        f"call: {args.calls} calls alternating with one fixed n_draft {args.fixed} session"
        f"{' (plain decoding, Generator)' if args.fixed == 0 else ''}.",
        "",
        f"**fresh session / fixed {args.fixed} session: median {statistics.median(ratios):.3f}x, mean {statistics.mean(ratios):.3f}x, "
        f"worst {min(ratios):.3f}x, sessions >= 0.97x: {sum(r >= 0.97 for r in ratios)}/{len(ratios)}**",
        "",
        "| session | fresh/fixed | mean length | lengths histogram |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {i} | {r:.3f}x | {m:.2f} | {h} |" for i, (r, m, h) in enumerate(rows)]
    name = "adaptive-sessions" + ("" if args.case == "~75%" else "-" + args.case.strip("~%"))
    name += "" if args.threads == 1 else f"-t{args.threads}"
    emit_report(name + ("-control" if args.control else ""), lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
