"""Replay n_draft="auto" offline: the speed fixture's exact acceptance, costs with noise, no model run.

The policy (the native DraftLengthPolicy, as the session uses it) drives a replay of greedy MTP
speculation on the speed fixture (its drafts are computed from the fixture's construction, so the
acceptance pattern, including how a draft length lines up with the cycle's "wrong" tokens, is the
real one). Each verify of length k costs the measured microseconds per verify of k, times noise:
lognormal (--noise), 2% of verifies 1.5x (another process preempting), and optionally a slow drift
shared by all lengths (--drift: AR(1) of log cost, 0.98 per verify). Prints the rate of every fixed
length and of auto (median over --seeds seeds, the first call of each seed not counted, as in
bench/adaptive.py), auto/best and the worst seed: noise-free evidence for tuning the policy, which
the machine's ±10-20% drift hides. Speed claims stay with bench/adaptive.py.

Costs: --measure times fixed-length sessions on this machine first (us per verify = tokens per
verify / tokens per second, medians of 5); otherwise the table below, measured that way here
(1 thread, 2 cores, 2026-12-02).

Usage: python bench/adaptive_sim.py [--wrong 0.14] [--seeds 60] [--noise 0.05] [--drift 0.015] [--measure]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

import llamaspec
from llamaspec import _native
from llamaspec_fixtures import FixtureInfo
from llamaspec_fixtures._common import _hidden_chain_drafts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive import mtp_fixture  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
N_MAX = 8
US_PER_VERIFY: dict[int, float] = {0: 3113.0, 1: 6583.0, 2: 7493.0, 3: 8429.0, 4: 8997.0, 5: 9598.0, 6: 10991.0, 7: 15063.0,
                                   8: 12787.0}
SHADOW_US = 350.0  # a one-token MTP draft in a plain step


def measure_costs(info: FixtureInfo, prompt: str, tokens: int) -> dict[int, float]:
    """Microseconds per verify of each fixed length (0: plain decoding), medians of 5 runs."""
    model = llamaspec.Model(info.path)
    sessions: dict[int, llamaspec.Generator | llamaspec.Speculative] = {0: llamaspec.Generator(model, n_ctx=1024, n_threads=1)}
    for k in range(1, N_MAX + 1):
        sessions[k] = llamaspec.Speculative(model, method="mtp", n_draft=k, n_ctx=1024, n_threads=1)
    us: dict[int, list[float]] = {k: [] for k in sessions}
    for _ in range(5):
        for k, s in sessions.items():
            s.generate(prompt, tokens, temperature=0)
            st = s.last_stats
            assert st is not None
            per_verify = st.tokens / st.iterations if st.iterations else 1.0  # tokens per target pass
            us[k].append(1e6 * per_verify / st.tokens_per_second)
    for s in sessions.values():
        s.close()
    model.close()
    return {k: statistics.median(v) for k, v in us.items()}


def replay(info: FixtureInfo, costs: dict[int, float], policy: _native.DraftLengthPolicy | None, fixed: int,
           rng: random.Random, args: argparse.Namespace) -> tuple[float, list[int]]:
    """Tokens per second of --calls calls of --tokens tokens (the first not counted) and the lengths chosen."""
    nxt, wrong = info.next_map, set(info.mtp_wrong)
    prompt = info.cycle[:8]
    total_us = 0.0
    total_tokens = 0
    hist = [0] * (N_MAX + 1)
    log_drift = 0.0
    for call in range(args.calls):
        prev, last = prompt[-2], prompt[-1]
        emitted, call_us = 0, 0.0
        while emitted < args.tokens:
            k = policy.choose() if policy else fixed
            k = max(0, min(k, args.tokens - emitted - 1))
            hist[k] += 1
            log_drift = 0.98 * log_drift + rng.gauss(0, args.drift)
            us = costs[k] * rng.lognormvariate(0, args.noise) * math.exp(log_drift)
            if rng.random() < 0.02:
                us *= 1.5
            accepted = 0
            if args.chain:  # acceptance by chain position, independent of the text
                while accepted < k and rng.random() < args.chain[min(accepted, len(args.chain) - 1)]:
                    accepted += 1
            else:
                drafts = _hidden_chain_drafts(nxt, wrong, prev, k) if k else []
                cur = last
                for d in drafts:
                    if d != nxt[cur]:
                        break
                    accepted, cur = accepted + 1, d
            if policy is not None:
                if k == 0 and policy.shadow:
                    if args.chain:
                        hit = rng.random() < args.chain[0]
                    else:
                        hit = _hidden_chain_drafts(nxt, wrong, prev, 1)[0] == nxt[last]
                    policy.observe_shadow(True, hit, SHADOW_US)
                    us += SHADOW_US
                policy.observe(k, k, accepted, 0.15 * us if k else 0.0, 0.85 * us if k else us)
            out = [last]
            for _ in range(accepted + 1):
                out.append(nxt[out[-1]])
            prev, last = out[-2], out[-1]
            emitted += accepted + 1
            call_us += us
        if call > 0:
            total_us += call_us
            total_tokens += emitted
    return total_tokens / total_us * 1e6, hist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wrong", type=float, default=0.14, help="the fixture's mtp_wrong_fraction (0.14: ~75%%)")
    ap.add_argument("--seeds", type=int, default=60)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--drift", type=float, default=0.0)
    ap.add_argument("--chain", type=lambda v: [float(x) for x in v.split(",")], default=None,
                    help="instead of the fixture's pattern: P(draft position i accepted | the ones before were), "
                         "e.g. 0.9,0.8,0.7 (the last repeats); a real MTP head's acceptance falls along its chain")
    ap.add_argument("--measure", action="store_true", help="time the fixed lengths on this machine first")
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    args = ap.parse_args()

    info, prompt = mtp_fixture(args.fixtures, args.wrong)
    costs = US_PER_VERIFY
    if args.measure:
        costs = measure_costs(info, prompt, args.tokens)
        print("us per verify:", " ".join(f"{k}:{v:.0f}" for k, v in costs.items()))

    fixed = {k: statistics.median(replay(info, costs, None, k, random.Random(s), args)[0] for s in range(args.seeds))
             for k in costs}
    best = max(fixed, key=lambda k: fixed[k])
    rates, hist = [], [0] * (N_MAX + 1)
    for s in range(args.seeds):
        rate, h = replay(info, costs, _native.DraftLengthPolicy(N_MAX, 0), 0, random.Random(1000 + s), args)
        rates.append(rate)
        hist = [a + b for a, b in zip(hist, h)]
    auto = statistics.median(rates)
    print("fixed:", " ".join(f"{k}:{v:.0f}" for k, v in fixed.items()), f"(best {best})")
    print(f"auto {auto:.0f} tok/s: auto/best {auto / fixed[best]:.3f}x, worst seed {min(rates) / fixed[best]:.3f}x, "
          f"lengths {hist}")


if __name__ == "__main__":
    main()
