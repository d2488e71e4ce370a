"""The one engine, measured three ways, each side by side in one run (medians of --runs, alternating):

  batch     SmolLM2 plain greedy: 4 calls of 48 tokens at once on Generator(n_seq=4) vs the same 4
            one after another on Generator(n_seq=1); the ratio of wall times (goal >= 1.5x at 2 threads);
            beside it, the same ratio from upstream's llama-batched-bench (same pinned tree, -npp 8
            -ntg 48 -npl 1,4): how much a batch of 4 can gain in llama.cpp itself on this machine
  sessions  two sessions of one process (Generator and MTP on the speed fixture, n_draft 3), each
            alone vs the two alternating call by call; each one's rate alternating / alone
            (goal >= 0.95x: an idle session must not slow the working one)
  overhead  what a Python consumer costs per token: the rate it sees while it iterates stream_events
            (its own clock at each Token) vs the engine's rate with no consumer (a call whose events
            wait in the queue until the engine is done; Done.stats: first to last token on the engine
            thread), alternating; the difference of their times per token (goal <= 5 us); also the
            consumer thread's CPU time per token (time.thread_time: conversion, iteration and the
            wake-up of a blocked thread). Tiny fixture (about 0.2 ms a token) and SmolLM2

Usage: python bench/engine.py [batch sessions overhead] [--runs 5] [--threads 1 2]
Writes a markdown report to bench/results/ (with this command line) unless --no-save.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import llamaspec
from llamaspec_fixtures import SPEED, TINY, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_decode import PROMPT, eog_bias, smollm2  # noqa: E402
from upstream import build_tools, emit_report, timed  # noqa: E402

PROMPTS = ["The history of the city of Paris begins", "Write a short poem about the sea:",
           "List the planets of the solar system:", "Once upon a time, in a small village,"]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def upstream_batch_ratio(model: str, threads: int, n: int) -> float:
    """llama-batched-bench: 4 x (total time at B=1) / (total time at B=4), prompts of 8 tokens."""
    binary = build_tools("llama-batched-bench") / "llama-batched-bench"
    out = subprocess.run([str(binary), "-m", model, "-c", "2048", "-b", "2048", "-ub", "512", "-npp", "8", "-ntg",
                          str(n), "-npl", "1,4", "-t", str(threads)], capture_output=True, text=True, check=True,
                         stdin=subprocess.DEVNULL).stdout
    total = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[2]):
            total[int(cells[2])] = float(cells[8])  # T s
    return 4 * total[1] / total[4]


def bench_batch(model: llamaspec.Model, threads: int, runs: int, n: int) -> list[str]:
    bias = eog_bias(model)
    kw = {"temperature": 0.0, "logit_bias": bias}
    together, apart, up = [], [], []
    with llamaspec.Generator(model, n_ctx=512, n_threads=threads, n_seq=4) as batch, \
         llamaspec.Generator(model, n_ctx=512, n_threads=threads) as one:
        want = [one.generate(p, n, **kw) for p in PROMPTS]  # warm-up, and the outputs to check
        assert batch.generate_batch(PROMPTS, n, **kw) == want
        for _ in range(runs):
            t0 = time.perf_counter()
            for p in PROMPTS:
                one.generate(p, n, **kw)
            apart.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = batch.generate_batch(PROMPTS, n, **kw)
            together.append(time.perf_counter() - t0)
            assert out == want
            up.append(upstream_batch_ratio(model.path, threads, n))
            print(f"  batch threads={threads}: one after another {apart[-1]:.3f} s, together {together[-1]:.3f} s"
                  f" | llama-batched-bench {up[-1]:.2f}x", flush=True)
    ratios = sorted(a / b for a, b in zip(apart, together))
    return [f"| batch | {threads} | 4 x {n} tokens, SmolLM2 | one after another {med(apart):.3f} s | together "
            f"{med(together):.3f} s | **{med(ratios):.2f}x** ({ratios[0]:.2f}-{ratios[-1]:.2f}); upstream "
            f"llama-batched-bench {med(up):.2f}x |"]


def bench_sessions(threads: int, runs: int, n: int, directory: Path) -> list[str]:
    info = write_qwen35_fixture(directory / "speed-mtp-0.14.gguf", spec=SPEED, mtp_wrong_fraction=0.14)
    rows = []
    with llamaspec.Model(info.path) as model:
        prompt = model.detokenize(info.cycle[:8])
        with llamaspec.Generator(model, n_ctx=1024, n_threads=threads) as gen, \
             llamaspec.MTP(model, n_draft=3, n_ctx=1024, n_threads=threads) as mtp:

            def rate(s: llamaspec.Generator | llamaspec.MTP) -> float:
                s.generate(prompt, n, temperature=0)
                assert s.last_stats is not None
                return s.last_stats.tokens_per_second

            rate(gen), rate(mtp)  # warm-up
            alone = {"plain": [], "mtp": []}  # type: dict[str, list[float]]
            mixed = {"plain": [], "mtp": []}  # type: dict[str, list[float]]
            for _ in range(runs):
                for name, s in (("plain", gen), ("mtp", mtp)):  # each alone: 3 calls in a row, the last counts
                    rate(s), rate(s)
                    alone[name].append(rate(s))
                for _ in range(2):  # alternating: a call of one, a call of the other
                    mixed["plain"].append(rate(gen))
                    mixed["mtp"].append(rate(mtp))
                print(f"  sessions threads={threads}: alone plain {alone['plain'][-1]:.0f} mtp {alone['mtp'][-1]:.0f}"
                      f" | alternating plain {mixed['plain'][-1]:.0f} mtp {mixed['mtp'][-1]:.0f} tok/s", flush=True)
    for name in ("plain", "mtp"):
        rows.append(f"| sessions ({name}) | {threads} | {n} tokens, speed fixture ~74% | alone {med(alone[name]):.1f} "
                    f"tok/s | alternating {med(mixed[name]):.1f} tok/s | **{med(mixed[name]) / med(alone[name]):.3f}x** |")
    return rows


def consumed(session: llamaspec.Generator, prompt: str, n: int, kw: dict[str, object]) -> tuple[float, float]:
    """A call read by a Python consumer: (its CPU us per token, the tok/s it sees)."""
    c0 = time.thread_time()
    stamps = []
    for ev in session.stream_events(prompt, n, **kw):  # type: ignore[arg-type]
        if isinstance(ev, llamaspec.Token):
            stamps.append(time.perf_counter())
    cpu = time.thread_time() - c0
    assert len(stamps) == n
    return cpu / n * 1e6, (n - 1) / (stamps[-1] - stamps[0])


def unconsumed(session: llamaspec.Generator, prompt: str, n: int, kw: dict[str, object]) -> float:
    """The engine's tok/s for a call nobody reads until it is over (its events wait in the queue)."""
    before = session.stats().tokens_emitted
    events = session.stream_events(prompt, n, **kw)  # type: ignore[arg-type]
    next(events)  # starts the call
    while session.stats().tokens_emitted < before + n:
        time.sleep(0.002)
    *_, done = events
    assert isinstance(done, llamaspec.Done) and done.stats.tokens == n
    return done.stats.tokens_per_second


def bench_overhead(label: str, path: str, prompt: str, threads: int, runs: int, n: int) -> list[str]:
    with llamaspec.Model(path) as model, llamaspec.Generator(model, n_ctx=2048, n_threads=threads) as gen:
        kw = {"temperature": 0.0, "logit_bias": eog_bias(model)}
        consumed(gen, prompt, 16, kw)
        cpu, seen, alone = [], [], []
        for _ in range(runs):
            c, r = consumed(gen, prompt, n, kw)
            cpu.append(c)
            seen.append(r)
            alone.append(unconsumed(gen, prompt, n, kw))
    per_token = (1 / med(seen) - 1 / med(alone)) * 1e6
    print(f"  overhead {label} threads={threads}: seen {med(seen):.1f} tok/s, engine alone {med(alone):.1f} tok/s, "
          f"consumer CPU {med(cpu):.1f} us/token", flush=True)
    return [f"| overhead | {threads} | {n} tokens, {label} | read by Python {med(seen):.1f} tok/s | engine alone "
            f"{med(alone):.1f} tok/s | **{per_token:+.2f} us/token** ({med(seen) / med(alone):.4f}x); consumer "
            f"CPU {med(cpu):.1f} us/token |"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", default=["batch", "sessions", "overhead"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=48, help="per call for batch; x4 for sessions and overhead")
    ap.add_argument("--fixtures", type=Path, default=Path(tempfile.gettempdir()) / "llamaspec-bench")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    args.fixtures.mkdir(parents=True, exist_ok=True)
    rows = []
    smol = smollm2()
    for threads in args.threads:
        if "batch" in args.which:
            with llamaspec.Model(smol) as model:
                rows += bench_batch(model, threads, args.runs, args.tokens)
        if "sessions" in args.which:
            rows += bench_sessions(threads, args.runs, 4 * args.tokens, args.fixtures)
        if "overhead" in args.which:
            tiny = write_qwen35_fixture(args.fixtures / "tiny-nomtp.gguf", spec=TINY, mtp=False)
            with llamaspec.Model(tiny.path, vocab_only=True) as vm:
                tiny_prompt = vm.detokenize(tiny.cycle[:8])
            rows += bench_overhead("tiny fixture", tiny.path, tiny_prompt, threads, args.runs, 8 * args.tokens)
            rows += bench_overhead("SmolLM2", smol, PROMPT, threads, args.runs, 4 * args.tokens)
    lines = [f"median of {args.runs} runs; {threading.active_count()} Python threads at the end",
             "", "| check | threads | work | A | B | ratio |", "| --- | --- | --- | --- | --- | --- |", *rows]
    emit_report("engine", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
