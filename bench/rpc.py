"""A model on two loopback RPC workers against the same model local, and against upstream's client over
the same kind of workers, side by side in one run.

For each model and thread count, four `llamaspec rpc-server` workers run on 127.0.0.1 with that many
threads: two serve our client, two upstream's (a worker serves one client at a time). Greedy
tokens/s of
  local      llamaspec.Generator on the model in this process
  rpc        llamaspec.Generator on Model(path, rpc_servers=[2 workers]) (every layer on the workers)
  rpc MTP    llamaspec.MTP on the same remote model (the MTP fixture only)
  upstream   llama-completion --rpc (plain) and llama-speculative-simple --rpc --spec-type draft-mtp,
             built with GGML_RPC from the same pinned tree (bench/upstream.py), -ngl 99
and the ratios rpc/local, ours/upstream, and the share of the remote run's time that local decoding
does not spend: 1 - rpc/local tokens/s, i.e. transport, (de)serialization and the hop between the two
workers (both compute on this machine's cores, as the local run does). Sides alternate in a rotating
order; medians of --runs.

Usage: python bench/rpc.py [--runs 5] [--threads 1 2] [--tokens 128]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import llamaspec
from llamaspec_fixtures import SPEED, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med, ours_rate, upstream_mtp, upstream_plain  # noqa: E402
from plain_decode import eog_bias, smollm2  # noqa: E402
from upstream import build_tools, emit_report, free_port, timed  # noqa: E402

N_DRAFT = 3


@contextmanager
def worker(threads: int) -> Iterator[str]:
    """A `llamaspec rpc-server` on a free loopback port; yields its endpoint."""
    port = free_port()
    exe = shutil.which("llamaspec", path=str(Path(sys.executable).parent)) or "llamaspec"
    proc = subprocess.Popen([exe, "rpc-server", "--port", str(port), "--threads", str(threads)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("rpc-server did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--fixtures", type=Path, default=Path(__file__).resolve().parent.parent / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    bin_dir = build_tools("llama-completion", "llama-speculative-simple")
    args.fixtures.mkdir(parents=True, exist_ok=True)
    fx = write_qwen35_fixture(args.fixtures / "speed-mtp-0.14.gguf", spec=SPEED, mtp_wrong_fraction=0.14)
    models = [("SmolLM2-135M Q4_1", smollm2(), None), ("MTP speed fixture (~74%)", fx.path, fx)]
    lines = [f"Greedy tokens/s, {args.tokens} tokens, medians of {args.runs} alternating runs; rpc = every "
             "layer on two loopback `llamaspec rpc-server` workers; MTP n_draft "
             f"{N_DRAFT}.", "",
             "| model | threads | local | rpc | rpc MTP | upstream rpc | upstream rpc MTP | rpc/local "
             "| transport share | ours/upstream plain | ours/upstream MTP |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, path, info in models:
        for threads in args.threads:
            with ExitStack() as stack:
                mine = [stack.enter_context(worker(threads)) for _ in range(2)]
                theirs = ",".join(stack.enter_context(worker(threads)) for _ in range(2))
                local = stack.enter_context(llamaspec.Model(path))
                remote = stack.enter_context(llamaspec.Model(path, rpc_servers=mine))
                prompt = local.detokenize(info.cycle[:8]) if info else "Write a short story about a lighthouse."
                bias = eog_bias(local)
                opts = {"n_ctx": 1024, "n_threads": threads}
                g_local = stack.enter_context(llamaspec.Generator(local, **opts))
                g_rpc = stack.enter_context(llamaspec.Generator(remote, **opts))
                up = ("--rpc", theirs, "-ngl", "99")
                sides: dict[str, Callable[[], float]] = {
                    "local": lambda: ours_rate(g_local, prompt, args.tokens, logit_bias=bias),
                    "rpc": lambda: ours_rate(g_rpc, prompt, args.tokens, logit_bias=bias),
                    "up": lambda: upstream_plain(bin_dir, path, prompt, args.tokens, threads, args.timeout, up),
                }
                if info:
                    mtp = stack.enter_context(llamaspec.MTP(remote, n_draft=N_DRAFT, **opts))
                    sides["mtp"] = lambda: ours_rate(mtp, prompt, args.tokens, logit_bias=bias)
                    sides["up_mtp"] = lambda: upstream_mtp(bin_dir, path, prompt, args.tokens, threads, N_DRAFT,
                                                           args.timeout, up)[0]
                for s in (g_local, g_rpc, *([mtp] if info else [])):
                    s.generate(prompt, 16, temperature=0)  # warm up
                names = list(sides)
                got: dict[str, list[float]] = {k: [] for k in names}
                for r in range(args.runs):
                    for k in names[r % len(names):] + names[:r % len(names)]:
                        got[k].append(sides[k]())
                    print(f"  {name} t={threads} run {r + 1}: "
                          + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), flush=True)
            m = {k: med(v) for k, v in got.items()}
            mtp_ours, mtp_up, mtp_ratio = ((f"{m['mtp']:.1f}", f"{m['up_mtp']:.1f}", f"{m['mtp'] / m['up_mtp']:.3f}")
                                           if info else ("-", "-", "-"))
            lines.append(
                f"| {name} | {threads} | {m['local']:.1f} | {m['rpc']:.1f} | {mtp_ours} | {m['up']:.1f} | {mtp_up} "
                f"| {m['rpc'] / m['local']:.3f} | {1 - m['rpc'] / m['local']:.0%} | {m['rpc'] / m['up']:.3f} "
                f"| {mtp_ratio} |")
    emit_report("rpc", lines, not args.no_save)


if __name__ == "__main__":
    timed(main)
