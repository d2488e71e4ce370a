"""A plain-decoding worker for bench/plain_decode.py, run by any llamaspec build's Python (this tree's,
or a baseline release's venv): it loads the model once, then for every line "N" on stdin generates N
greedy tokens (end-of-generation tokens banned) and prints "end-to-end-tok/s eval-only-tok/s".
It uses only API that every release has.

Usage: python bench/_plain_worker.py MODEL THREADS PROMPT
"""

from __future__ import annotations

import sys

import llamaspec


def main() -> None:
    path, threads, prompt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model = llamaspec.Model(path)
    bias = {i: float("-inf") for i in range(model.n_vocab) if model.is_eog(i)}
    gen = llamaspec.Generator(model, n_ctx=2048, n_threads=threads, no_perf=False)
    print("ready", flush=True)
    for line in sys.stdin:
        n = int(line)
        gen.context.perf_reset()
        gen.generate(prompt, n, temperature=0.0, logit_bias=bias)
        st = gen.last_stats
        assert st is not None and st.tokens == n, st
        perf = gen.context.perf()
        print(f"{st.tokens_per_second} {perf['eval_runs'] / (perf['eval_ms'] / 1e3)}", flush=True)


if __name__ == "__main__":
    main()
