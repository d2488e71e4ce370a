"""One cached turn's prompt decode by five paths, side by side in one run (issue 15's 2-thread gap).

A history of --history token ids is cached; each request adds --new ids and asks for one token.
Timed, per request, only the decode of the new ids:

- context: a bare `llamaspec.Context` (our extension, no engine): the history decoded afresh
  (untimed), then the new ids (timed);
- engine: a `Generator` that keeps its cache across requests (what `serve` and the library do):
  its call's own `prefill_time`;
- fresh engine: a new `Generator` per request, the history decoded by a first call (untimed);
- llama-server (built from the same pinned tree, -np 1, its prompt cache on): `timings.prompt_ms`;
- llama-bench (the same build; `-p NEW -d HISTORY -r 1`, a process per request, its own random
  tokens): the decode of the new tokens after the depth, the upstream oracle for the bare decode.

The five alternate request by request, the order reversed every other round; a pause of 0.3 s after
each (ggml's pools poll for new work after a decode). SmolLM2 by default, greedy, random ids.

Usage: python bench/prefill_paths.py [--runs 8] [--threads 2] [--history 1648] [--new 150] [--no-save]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med  # noqa: E402
from plain_decode import smollm2  # noqa: E402
from upstream import build_tools, emit_report, free_port, serving, timed  # noqa: E402

PAUSE_S = 0.3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history", type=int, default=1648)
    ap.add_argument("--new", type=int, default=150)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    path = smollm2()
    rng = random.Random(1)
    hist = [rng.randrange(100, 40000) for _ in range(args.history)]
    news = [[rng.randrange(100, 40000) for _ in range(args.new)] for _ in range(args.runs)]
    bin_dir = build_tools("llama-server", "llama-bench")
    port = free_port()
    t = str(args.threads)
    server = [str(bin_dir / "llama-server"), "-m", path, "--port", str(port), "-t", t, "-tb", t,
              "-c", str(args.n_ctx), "-np", "1", "--no-webui"]
    got: dict[str, list[float]] = {"context": [], "engine": [], "fresh engine": [], "llama-server": [],
                                   "llama-bench": []}
    bench = [str(bin_dir / "llama-bench"), "-m", path, "-p", str(args.new), "-n", "0",
             "-d", str(args.history), "-t", t, "-r", "1", "-o", "json"]
    opts = {"n_ctx": args.n_ctx, "n_threads": args.threads}
    with llamaspec.Model(path) as model, serving(server, port) as url, httpx.Client(timeout=600) as h, \
            llamaspec.Context(model, **opts) as ctx, llamaspec.Generator(model, **opts) as gen:
        gen.generate(hist, 1, temperature=0)
        h.post(url + "/completion", json={"prompt": hist, "n_predict": 1, "cache_prompt": True})

        def one(side: str, new: list[int]) -> float:
            if side == "context":
                ctx.clear()
                ctx.decode(hist)
                time.sleep(PAUSE_S)
                t0 = time.perf_counter()
                ctx.decode(new, len(hist))
                return time.perf_counter() - t0
            if side == "llama-bench":
                out = subprocess.run(bench, capture_output=True, text=True, check=True).stdout
                return float(json.loads(out)[0]["samples_ns"][0]) / 1e9
            if side == "llama-server":
                r = h.post(url + "/completion", json={"prompt": hist + new, "n_predict": 1,
                                                      "cache_prompt": True}).json()
                assert r["timings"]["cache_n"] == len(hist), r["timings"]
                return float(r["timings"]["prompt_ms"]) / 1e3
            if side == "engine":
                g = gen
            else:
                g = llamaspec.Generator(model, **opts)
                g.generate(hist, 1, temperature=0)
                time.sleep(PAUSE_S)
            g.generate(hist + new, 1, temperature=0)
            st = g.last_stats
            assert st is not None and st.cached_tokens == len(hist), st
            if g is not gen:
                g.close()
            return st.prefill_time

        sides = list(got)
        for k, new in enumerate(news):
            for side in (sides if k % 2 == 0 else sides[::-1]):
                got[side].append(one(side, new))
                time.sleep(PAUSE_S)
    base = med(got["llama-server"])
    lines = [f"{args.new} new tokens over {args.history} cached, {args.threads} threads, "
             f"{Path(path).name}; medians of {args.runs} requests a side, alternating", "",
             "| path | decode of the new tokens (ms) | / llama-server | runs (ms) |",
             "| --- | --- | --- | --- |"]
    for side, v in got.items():
        lines.append(f"| {side} | {med(v) * 1e3:.1f} | {med(v) / base:.3f} | "
                     f"{' '.join(f'{x * 1e3:.0f}' for x in v)} |")
    emit_report("prefill_paths", lines, not args.no_save)


if __name__ == "__main__":
    timed(main)
