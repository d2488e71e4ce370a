"""Time to the first token of speculative calls against plain ones, side by side in one run.

On SmolLM2 (an attention-only target), a --prompt-token prompt decoded whole by every call
(cache_prompt off), one token generated:

- library: `Generator` (plain), `Speculative` with SmolLM2 drafting for itself (draft-simple) and
  with ngram-simple; each call's time to its first token, timed by the caller;
- servers: llama-server plain and with the same draft model (-md), /completion streamed, the
  client's time to the first chunk.

The ratios spec/plain say what a drafter adds before the first token on each side (ADR 0014: our
speculative calls sample it from the prompt's own decode, as plain ones do). Sides alternate in a
rotating order; medians of --runs.

Usage: python bench/spec_ttft.py [--runs 9] [--threads 1 2] [--prompt-tokens 300]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med  # noqa: E402
from plain_decode import smollm2  # noqa: E402
from prompt_cache import sse_ttft, wait_out_polling  # noqa: E402
from upstream import build_tools, emit_report, free_port, serving, timed  # noqa: E402


def first_token(session: llamaspec.Generator | llamaspec.Speculative, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    for ev in session.stream_events(prompt, 1, temperature=0, cache_prompt=False):
        if isinstance(ev, llamaspec.Token):
            return time.perf_counter() - t0
    raise RuntimeError("no token")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--prompt-tokens", type=int, default=300)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    path = smollm2()
    bin_dir = build_tools("llama-server")
    lines = [f"SmolLM2, a {args.prompt_tokens}-token prompt decoded whole by every call, one token; "
             f"medians of {args.runs}; time to the first token (ms).", "",
             "| threads | plain | draft-simple | ngram-simple | draft/plain | ngram/plain "
             "| llama-server plain | llama-server -md | -md/plain |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rng = random.Random(5)
    with llamaspec.Model(path) as model:
        for threads in args.threads:
            common = {"n_ctx": 1024, "n_threads": threads}
            ps, pd = free_port(), free_port()

            def flags(port: int) -> list[str]:
                return ["-m", path, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                        "-tb", str(threads), "-c", "1024", "-np", "1", "--no-webui"]

            server = str(bin_dir / "llama-server")
            with (llamaspec.Generator(model, **common) as plain,
                  llamaspec.Speculative(model, method="draft", draft_model=path, n_draft=3,
                                        **common) as draft,
                  llamaspec.Speculative(model, method="ngram-simple", n_draft=3, **common) as ngram,
                  serving([server, *flags(ps)], ps) as up_plain,
                  serving([server, *flags(pd), "-md", path, "--spec-draft-n-max", "3"], pd) as up_draft,
                  httpx.Client(timeout=600) as h):

                def up(url: str) -> Callable[[list[int]], float]:
                    return lambda p: sse_ttft(h, url, {"prompt": p, "n_predict": 1, "temperature": 0,
                                                       "stream": True, "cache_prompt": False})[0]

                sides = {"plain": lambda p: first_token(plain, p), "draft": lambda p: first_token(draft, p),
                         "ngram": lambda p: first_token(ngram, p), "up_plain": up(up_plain),
                         "up_draft": up(up_draft)}
                names = list(sides)
                got: dict[str, list[float]] = {k: [] for k in names}
                warm = [rng.randrange(200, model.n_vocab) for _ in range(args.prompt_tokens)]
                for k in names:
                    sides[k](warm)
                    wait_out_polling()
                for r in range(args.runs):
                    prompt = [rng.randrange(200, model.n_vocab) for _ in range(args.prompt_tokens)]
                    for k in names[r % len(names):] + names[:r % len(names)]:
                        got[k].append(sides[k](prompt))
                        wait_out_polling()
            m = {k: med(v) * 1e3 for k, v in got.items()}
            lines.append(f"| {threads} | {m['plain']:.1f} | {m['draft']:.1f} | {m['ngram']:.1f} "
                         f"| {m['draft'] / m['plain']:.3f} | {m['ngram'] / m['plain']:.3f} "
                         f"| {m['up_plain']:.1f} | {m['up_draft']:.1f} "
                         f"| {m['up_draft'] / m['up_plain']:.3f} |")
    emit_report("spec_ttft", lines, not args.no_save)


if __name__ == "__main__":
    timed(main)
