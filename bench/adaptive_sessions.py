"""n_draft="auto" across fresh sessions: how often does a session settle on a poor length?

bench/adaptive.py measures one auto session; where it settles (and so its ratio) varies from session to
session. This creates --sessions fresh auto sessions in turn on one MTP speed fixture (default ~75%),
lets each learn during one untimed call, then times --calls calls alternating with a fixed-length
session (--fixed, the best fixed length of bench/adaptive.py at ~75%), so the machine's drift hits
both alike. Per session: auto/fixed (sum of tokens/s over its calls), mean chosen length, histogram;
then the median, mean and worst session. --control makes the fresh sessions fixed-length ones too
(n_draft --fixed): the spread of identical sessions (memory placement, the machine), against which
the auto sessions' spread is read.

Usage: python bench/adaptive_sessions.py [--sessions 12] [--calls 5] [--fixed 5] [--wrong 0.14] [--tokens 256]
       [--control]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Literal

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive import mtp_fixture  # noqa: E402
from mtp_speed import ours_rate  # noqa: E402
from upstream import emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--fixed", type=int, default=5)
    ap.add_argument("--wrong", type=float, default=0.14, help="the fixture's mtp_wrong_fraction (0.14: ~75%%)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--control", action="store_true", help="fresh sessions with n_draft --fixed instead of auto")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    info, prompt = mtp_fixture(args.fixtures, args.wrong)
    model = llamaspec.Model(info.path)
    fixed = llamaspec.Speculative(model, method="mtp", n_draft=args.fixed, n_ctx=1024, n_threads=1)
    want = fixed.generate(prompt, args.tokens, temperature=0)
    rows = []
    for i in range(args.sessions):
        n_draft: int | Literal["auto"] = args.fixed if args.control else "auto"
        with llamaspec.Speculative(model, method="mtp", n_draft=n_draft, n_ctx=1024, n_threads=1) as auto:
            assert auto.generate(prompt, args.tokens, temperature=0) == want  # its learning call, untimed
            auto.reset_stats()
            mine, theirs = [], []
            for _ in range(args.calls):
                theirs.append(ours_rate(fixed, prompt, args.tokens))
                mine.append(ours_rate(auto, prompt, args.tokens))
            st = auto.stats()
            rows.append((sum(mine) / sum(theirs), st.mean_draft_length, list(st.draft_length_histogram)))
        print(f"  session {i}: fresh/fixed {rows[-1][0]:.3f}, mean length {rows[-1][1]:.2f}, lengths {rows[-1][2]}",
              flush=True)
    fixed.close()
    model.close()

    ratios = [r[0] for r in rows]
    lines = [
        f"MTP speed fixture, mtp_wrong_fraction {args.wrong}, greedy, {args.tokens} tokens, 1 thread; {args.sessions} fresh "
        f"{'control (n_draft ' + str(args.fixed) + ')' if args.control else 'auto'} sessions, each after one untimed "
        f"call: {args.calls} calls alternating with one fixed n_draft {args.fixed} session.",
        "",
        f"**fresh session / fixed {args.fixed} session: median {statistics.median(ratios):.3f}x, mean {statistics.mean(ratios):.3f}x, "
        f"worst {min(ratios):.3f}x, sessions >= 0.97x: {sum(r >= 0.97 for r in ratios)}/{len(ratios)}**",
        "",
        "| session | fresh/fixed | mean length | lengths histogram |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {i} | {r:.3f}x | {m:.2f} | {h} |" for i, (r, m, h) in enumerate(rows)]
    emit_report("adaptive-sessions-control" if args.control else "adaptive-sessions", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
