"""MTP speed on the 86 MB speed fixture: plain vs MTP, ours vs upstream, side by side in one run.

For each acceptance level the fixture was built for (100%, ~74% at n_draft 3, 0%) and each n_draft,
this measures greedy tokens/s of
  ours       llamaspec.Generator (plain) and llamaspec.MTP (n_draft)
  upstream   llama-completion (plain) and llama-speculative-simple --spec-type draft-mtp (default), or
             with --upstream server: llama-server (plain, and --spec-type draft-mtp), timings from
             /completion's timings.predicted_per_second; all built bench-only from the same pinned
             tree with the same CPU flags (bench/upstream.py)
and prints ours/upstream and both MTP/plain ratios. Medians of --runs runs; every upstream run has its
own time limit (2-thread runs sometimes stall on these machines); a stalled run is dropped and said.

Ratios ours/upstream are given as the ratio of medians and as the median of per-pair ratios (run i of
ours over run i of upstream, measured back to back), which cancels the machine's slow drifts.

Rates: ours = (tokens - 1) / (first-to-last-token time); upstream plain = n_eval / (total - prompt
time) from llama-completion's perf print; upstream MTP = llama-speculative-simple's "decoded N tokens
in T seconds" (its whole generation loop).

Usage: python bench/mtp_speed.py [--runs 5] [--threads 1 2] [--n-draft 1 2 3 4 5] [--tokens 256]
       [--two-thread-n-draft 3] [--fixtures DIR] [--n-gpu-layers N]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import urllib.request
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import llamaspec
from llamaspec_fixtures import SPEED, FixtureInfo, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream import build_tools, emit_report, free_port, serving, timed  # noqa: E402

LEVELS = {"100%": 0.0, "~74%": 0.14, "0%": 1.0}

_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms")
_TOTAL = re.compile(r"total time =\s*([\d.]+) ms")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def upstream_plain(bin_dir: Path, model: str, prompt: str, n: int, threads: int, timeout: float,
                   extra: tuple[str, ...] = ()) -> float:
    cmd = [str(bin_dir / "llama-completion"), "-m", model, "-p", prompt, "-n", str(n), "-t", str(threads),
           "-tb", str(threads), "-c", "1024", "--temp", "0", "--ignore-eos", "-no-cnv", "--perf", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    m, pr, tot = _EVAL.search(log), _PROMPT.search(log), _TOTAL.search(log)
    if p.returncode != 0 or not (m and pr and tot):
        raise RuntimeError(f"llama-completion failed ({p.returncode}): {log[-1500:]}")
    return int(m.group(2)) / ((float(tot.group(1)) - float(pr.group(1))) / 1e3)


def upstream_speculative(bin_dir: Path, model: str, prompt: str, n: int, threads: int, spec_args: list[str],
                         timeout: float, extra: tuple[str, ...] = ()) -> tuple[float, float]:
    """llama-speculative-simple with the given --spec-* arguments: (tokens/s, acceptance)."""
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", model, "-p", prompt, "-n", str(n), "-t", str(threads),
           "-tb", str(threads), "-c", "1024", "--temp", "0", *spec_args, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    log = p.stdout + p.stderr
    m, a = _DECODED.search(log), _ACCEPT.search(log)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"llama-speculative-simple failed ({p.returncode}): {log[-1500:]}")
    return int(m.group(1)) / float(m.group(2)), float(a.group(1)) / 100 if a else float("nan")


def upstream_mtp(bin_dir: Path, model: str, prompt: str, n: int, threads: int, n_draft: int,
                 timeout: float, extra: tuple[str, ...] = ()) -> tuple[float, float]:
    return upstream_speculative(bin_dir, model, prompt, n, threads, [
        "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_draft), "--spec-draft-n-min", "0"], timeout,
        extra)


@contextmanager
def llama_server(bin_dir: Path, model: str, threads: int, n_draft: int | None, timeout: float,
                 ngl: int = 0) -> Iterator[str]:
    """A llama-server on 127.0.0.1 for one configuration (n_draft None: plain decoding)."""
    port = free_port()
    cmd = [str(bin_dir / "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", "1024", "-np", "1", "--no-webui", "-ngl", str(ngl)]
    if n_draft is not None:
        cmd += ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_draft), "--spec-draft-n-min", "0"]
    with serving(cmd, port, timeout) as url:
        yield url


def server_completion(url: str, prompt: str, n: int, timeout: float) -> tuple[float, float]:
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            t = json.load(r)["timings"]
    except TimeoutError as e:
        raise subprocess.TimeoutExpired("llama-server /completion", timeout) from e
    drafted = t.get("draft_n", 0)
    return float(t["predicted_per_second"]), (t.get("draft_n_accepted", 0) / drafted if drafted else float("nan"))


def upstream_for(args: argparse.Namespace, bin_dir: Path, model: str, threads: int,
                 n_draft: int | None) -> contextlib.AbstractContextManager[str]:
    """A running llama-server's URL with --upstream server, else "" (the one-shot tools are used)."""
    if args.upstream == "server":
        return llama_server(bin_dir, model, threads, n_draft, args.timeout, args.n_gpu_layers)
    return contextlib.nullcontext("")


T = TypeVar("T")


def ours_rate(session: llamaspec.Generator | llamaspec.Speculative, prompt: str, n: int, **call: Any) -> float:
    """Greedy tokens/s of one call (``call``: more of generate's options, e.g. logit_bias)."""
    session.generate(prompt, n, temperature=0, **call)
    assert session.last_stats is not None
    return session.last_stats.tokens_per_second


def measure(runs: int, ours: Callable[[], float], upstream: Callable[[], T], label: str) -> tuple[list[float], list[T]]:
    """Alternate our runs with upstream's; an upstream run that stalls past its time limit or fails
    (seen once: exit 0 without its summary lines) drops its pair, and says so."""
    mine: list[float] = []
    theirs: list[T] = []
    for _ in range(runs):
        o = ours()
        try:
            u = upstream()
        except (subprocess.TimeoutExpired, RuntimeError) as e:
            print(f"  {label}: upstream run dropped ({type(e).__name__}), pair dropped", flush=True)
            continue
        mine.append(o)
        theirs.append(u)
    return mine, theirs


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--n-draft", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--two-thread-n-draft", type=int, nargs="+", default=[3],
                    help="the subset of n_draft measured at more than one thread")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--upstream", choices=["simple", "server"], default="simple",
                    help="upstream MTP tool: llama-speculative-simple or llama-server")
    ap.add_argument("--levels", nargs="+", choices=list(LEVELS), default=list(LEVELS))
    ap.add_argument("--fixtures", type=Path, default=Path(__file__).resolve().parent.parent / "build" / "fixtures")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="layers offloaded, ours and upstream's (-ngl)")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    ngl = ("-ngl", str(args.n_gpu_layers))

    tools = ["llama-completion", "llama-speculative-simple"] if args.upstream == "simple" else ["llama-server"]
    bin_dir = build_tools(*tools)
    args.fixtures.mkdir(parents=True, exist_ok=True)
    rows = []
    for level, wrong in ((lv, LEVELS[lv]) for lv in args.levels):
        path = args.fixtures / f"speed-mtp-{wrong}.gguf"
        info: FixtureInfo = write_qwen35_fixture(path, spec=SPEED, mtp_wrong_fraction=wrong)
        model = llamaspec.Model(path, n_gpu_layers=args.n_gpu_layers)
        prompt = model.detokenize(info.cycle[:8])  # on the cycle: every draft is as designed
        for threads in args.threads:
            drafts = args.n_draft if threads == 1 else [d for d in args.n_draft if d in args.two_thread_n_draft]
            gen = llamaspec.Generator(model, n_ctx=1024, n_threads=threads)
            gen.generate(prompt, 16, temperature=0)
            with upstream_for(args, bin_dir, str(path), threads, None) as url:
                ours_plain, up_plain = measure(
                    args.runs, lambda: ours_rate(gen, prompt, args.tokens),
                    lambda: (server_completion(url, prompt, args.tokens, args.timeout)[0] if url else
                             upstream_plain(bin_dir, str(path), prompt, args.tokens, threads, args.timeout, ngl)),
                    f"{level} t={threads} plain")
            gen.close()
            for nd in drafts:
                mtp = llamaspec.MTP(model, n_draft=nd, n_ctx=1024, n_threads=threads)
                mtp.generate(prompt, 16, temperature=0)
                mtp.reset_stats()
                with upstream_for(args, bin_dir, str(path), threads, nd) as url:
                    ours, up_runs = measure(
                        args.runs, lambda: ours_rate(mtp, prompt, args.tokens),
                        lambda: (server_completion(url, prompt, args.tokens, args.timeout) if url else
                                 upstream_mtp(bin_dir, str(path), prompt, args.tokens, threads, nd, args.timeout,
                                              ngl)),
                        f"{level} t={threads} n_draft={nd}")
                up = [r for r, _ in up_runs]
                acc_up = [a for _, a in up_runs]
                acc = mtp.stats().acceptance_rate
                mtp.close()
                pairs = [a / b for a, b in zip(ours, up)]
                row = dict(level=level, threads=threads, n_draft=nd, ours_plain=med(ours_plain),
                           up_plain=med(up_plain), ours=med(ours), up=med(up), acc=acc, acc_up=med(acc_up),
                           paired=med(pairs))
                rows.append(row)
                print(f"  {level:>5} t={threads} n_draft={nd}: ours {row['ours']:7.1f} (plain {row['ours_plain']:6.1f}, "
                      f"acc {acc:.3f})  upstream {row['up']:7.1f} (plain {row['up_plain']:6.1f}, acc {row['acc_up']:.3f})",
                      flush=True)
        model.close()

    lines = [
        f"speed fixture (qwen35, {SPEED.n_trunk} trunk layers, n_embd {SPEED.n_embd}, F16), {args.tokens} tokens "
        f"greedy, median of {args.runs} runs, upstream = "
        f"{'llama-server' if args.upstream == 'server' else 'llama-completion / llama-speculative-simple'}",
        "",
        "| acceptance | threads | n_draft | ours MTP tok/s | ours plain | **ours MTP/plain** | upstream MTP tok/s "
        "| upstream plain | upstream MTP/plain | **ours/upstream (MTP)** medians / pairs | acceptance ours / upstream |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['level']} | {r['threads']} | {r['n_draft']} | {r['ours']:.1f} | {r['ours_plain']:.1f} | "
            f"**{r['ours'] / r['ours_plain']:.2f}x** | {r['up']:.1f} | {r['up_plain']:.1f} | "
            f"{r['up'] / r['up_plain']:.2f}x | **{r['ours'] / r['up']:.2f}x** / {r['paired']:.2f}x | "
            f"{r['acc']:.3f} / {r['acc_up']:.3f} |")
    emit_report("mtp_speed", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
