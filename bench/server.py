"""`llamaspec serve` vs the library in-process vs llama-server, side by side in one run.

On the MTP speed fixture (qwen35, ~74% acceptance at n_draft 3 by default), greedy, ignore-EOS:

- one client: tokens/s a client sees (streamed; (tokens - 1) / first-to-last-token time, timed by
  the client) for the library (MTP session, stream_events), `llamaspec serve` (/v1/completions,
  SSE) and llama-server (/completion, SSE), same MTP settings, 1 and 2 threads; and the time to the
  first token of each (the server's added TTFT = ours over HTTP minus the library).
- time to first token: many short calls (2 tokens) alternating library and serve, with the bare
  HTTP round trip (GET /health, same connection) beside them.
- several clients: N clients at once (-np N on both servers), each N tokens; aggregate tokens/s =
  all tokens / wall time from the first request to the last end.

Every repetition runs the sides back to back in alternating order; medians of --runs, and the median
of per-repetition ratios (which cancels the machine's drift).

Usage: python bench/server.py [--runs 5] [--threads 1 2] [--clients 4 8] [--tokens 128] [--level ~74%]
       [--sections one many ttft] [--ttft-runs 30]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar
from pathlib import Path

import httpx

import llamaspec
from llamaspec_fixtures import SPEED, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import LEVELS, med  # noqa: E402
from plain_decode import eog_bias  # noqa: E402
from upstream import build_tools, emit_report, free_port, serving, timed  # noqa: E402

Measure = tuple[float, float, int]  # (tokens/s, seconds to the first token, tokens)


def rate(t_start: float, times: list[float]) -> Measure:
    n = len(times)
    r = (n - 1) / (times[-1] - times[0]) if n > 1 and times[-1] > times[0] else 0.0
    return r, times[0] - t_start if times else float("nan"), n


def library_stream(
    session: llamaspec.Speculative, prompt: list[int], n: int, banned: dict[int, float]
) -> Measure:
    times: list[float] = []
    t0 = time.perf_counter()
    for ev in session.stream_events(prompt, n, temperature=0, logit_bias=banned):
        if isinstance(ev, llamaspec.Token):
            times.append(time.perf_counter())
    return rate(t0, times)


def sse_stream(h: httpx.Client, url: str, body: dict[str, object], text_of: Callable[[dict], str]) -> Measure:
    """Stream one request; a time per chunk that carries text (one token each on both servers). A
    kept-alive connection the server closed while idle (llama-server does after a few seconds) is
    retried once on a new one."""
    try:
        return _sse_stream(h, url, body, text_of)
    except httpx.RemoteProtocolError:
        return _sse_stream(h, url, body, text_of)


def _sse_stream(
    h: httpx.Client, url: str, body: dict[str, object], text_of: Callable[[dict], str]
) -> Measure:
    times: list[float] = []
    t0 = time.perf_counter()
    with h.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if text_of(chunk):
                times.append(time.perf_counter())
    return rate(t0, times)


def ours_text(chunk: dict) -> str:
    return chunk["choices"][0]["text"] if chunk.get("choices") else ""


def upstream_text(chunk: dict) -> str:
    return "" if chunk.get("stop") else chunk.get("content", "")


def shared_flags(model: str, port: int, threads: int, n_seq: int, n_draft: int) -> list[str]:
    """The settings both servers run with, in llama-server's spelling (`llamaspec serve` takes it)."""
    # fmt: off
    return ["-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-c", str(1024 * n_seq), "-np", str(n_seq), "--spec-type", "draft-mtp",
            "--spec-draft-n-max", str(n_draft), "--spec-draft-n-min", "0"]
    # fmt: on


def ours_cmd(model: str, port: int, threads: int, n_seq: int, n_draft: int) -> list[str]:
    return [sys.executable, "-m", "llamaspec", "serve", *shared_flags(model, port, threads, n_seq, n_draft)]


def upstream_cmd(bin_dir: Path, model: str, port: int, threads: int, n_seq: int, n_draft: int) -> list[str]:
    return [str(bin_dir / "llama-server"), *shared_flags(model, port, threads, n_seq, n_draft), "--no-webui"]


def concurrent(n: int, one: Callable[[], Measure]) -> float:
    """Aggregate tokens/s of n clients started together."""
    results: list[Measure] = []
    lock = threading.Lock()

    def run() -> None:
        m = one()
        with lock:
            results.append(m)

    threads = [threading.Thread(target=run) for _ in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return sum(m[2] for m in results) / wall


T = TypeVar("T")


def alternate(
    sides: dict[str, Callable[[], T]], runs: int, label: str = "", shown: Callable[[T], float] | None = None
) -> dict[str, list[T]]:
    """Each side once to warm up, then `runs` repetitions with the sides in alternating order; with a
    label, one progress line per repetition (``shown`` picks the figure to print)."""
    for f in sides.values():
        f()
    got: dict[str, list[T]] = {k: [] for k in sides}
    for rep in range(runs):
        for k in list(sides) if rep % 2 == 0 else list(reversed(sides)):
            got[k].append(sides[k]())
        if label and shown is not None:
            figures = ", ".join(f"{k} {shown(got[k][-1]):.1f}" for k in sides)
            print(f"  {label} rep {rep}: {figures}", flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--clients", type=int, nargs="+", default=[4, 8])
    ap.add_argument(
        "--client-threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="threads of the servers with several clients",
    )
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--level", choices=list(LEVELS), default="~74%")
    ap.add_argument(
        "--fixtures", type=Path, default=Path(__file__).resolve().parent.parent / "build" / "fixtures"
    )
    ap.add_argument(
        "--ttft-runs", type=int, default=30, help="repetitions of the time-to-first-token section"
    )
    ap.add_argument("--sections", nargs="+", choices=["one", "many", "ttft"], default=["one", "many", "ttft"])
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    bin_dir = build_tools("llama-server") if {"one", "many"} & set(args.sections) else Path()
    args.fixtures.mkdir(parents=True, exist_ok=True)
    path = args.fixtures / f"speed-mtp-{LEVELS[args.level]}.gguf"
    info = write_qwen35_fixture(path, spec=SPEED, mtp_wrong_fraction=LEVELS[args.level])
    model = llamaspec.Model(path)
    prompt_ids = list(info.cycle[:8])  # on the cycle: every draft is as designed
    banned = eog_bias(model)  # = the servers' ignore_eos
    prompt = model.detokenize(prompt_ids)
    n = args.tokens
    ours_body = {"prompt": prompt_ids, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True}
    up_body = {
        "prompt": prompt_ids,
        "n_predict": n,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    lines = [
        f"speed fixture (qwen35, {SPEED.n_trunk} trunk layers, n_embd {SPEED.n_embd}, F16), MTP n_draft "
        f"{args.n_draft}, {args.level} acceptance, {n} tokens greedy, prompt {len(prompt_ids)} tokens "
        f"({prompt[:40]!r}...), median of {args.runs} repetitions, sides alternating; client-side rates.",
    ]
    if "one" in args.sections:
        lines += [
            "",
            "## One client",
            "",
            "| threads | library tok/s | serve tok/s | llama-server tok/s | serve/library "
            "| serve/llama-server | TTFT library / serve / llama-server (ms) | serve's added TTFT (ms) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
    with httpx.Client(timeout=300) as h:
        for threads in args.threads if "one" in args.sections else []:
            lib = llamaspec.MTP(model, n_draft=args.n_draft, n_ctx=1024, n_threads=threads)
            library_stream(lib, prompt_ids, 16, banned)
            po, pu = free_port(), free_port()
            with (
                serving(ours_cmd(str(path), po, threads, 1, args.n_draft), po) as ours_url,
                serving(upstream_cmd(bin_dir, str(path), pu, threads, 1, args.n_draft), pu) as up_url,
            ):
                sides: dict[str, Callable[[], Measure]] = {
                    "library": lambda: library_stream(lib, prompt_ids, n, banned),
                    "serve": lambda: sse_stream(h, ours_url + "/v1/completions", ours_body, ours_text),
                    "upstream": lambda: sse_stream(h, up_url + "/completion", up_body, upstream_text),
                }
                got = alternate(sides, args.runs, f"t={threads}", lambda m: m[0])
            lib.close()
            r = {k: med([m[0] for m in v]) for k, v in got.items()}
            ttft = {k: med([m[1] for m in v]) * 1e3 for k, v in got.items()}
            vs_lib = med([a[0] / b[0] for a, b in zip(got["serve"], got["library"])])
            vs_up = med([a[0] / b[0] for a, b in zip(got["serve"], got["upstream"])])
            added = med([(a[1] - b[1]) * 1e3 for a, b in zip(got["serve"], got["library"])])
            lines.append(
                f"| {threads} | {r['library']:.1f} | {r['serve']:.1f} | {r['upstream']:.1f} | "
                f"{r['serve'] / r['library']:.3f}x (pairs {vs_lib:.3f}x) | "
                f"{r['serve'] / r['upstream']:.3f}x (pairs {vs_up:.3f}x) | "
                f"{ttft['library']:.1f} / {ttft['serve']:.1f} / {ttft['upstream']:.1f} | {added:.1f} |"
            )
        lines += (
            []
            if "many" not in args.sections
            else [
                "",
                f"## Several clients (-np = clients, {n} tokens each; aggregate = all tokens / wall time)",
                "",
                "| threads | clients | serve aggregate tok/s | llama-server aggregate tok/s "
                "| ratio (pairs) |",
                "| --- | --- | --- | --- | --- |",
            ]
        )
        for t in args.client_threads if "many" in args.sections else []:
            for clients in args.clients:
                po, pu = free_port(), free_port()
                with (
                    serving(ours_cmd(str(path), po, t, clients, args.n_draft), po) as ours_url,
                    serving(upstream_cmd(bin_dir, str(path), pu, t, clients, args.n_draft), pu) as up_url,
                    httpx.Client(timeout=300, limits=httpx.Limits(max_connections=64)) as hc,
                ):
                    sides2: dict[str, Callable[[], float]] = {
                        "serve": lambda: concurrent(
                            clients,
                            lambda: sse_stream(hc, ours_url + "/v1/completions", ours_body, ours_text),
                        ),
                        "upstream": lambda: concurrent(
                            clients, lambda: sse_stream(hc, up_url + "/completion", up_body, upstream_text)
                        ),
                    }
                    agg = alternate(sides2, args.runs, f"t={t} clients={clients}", float)
                pairs = med([a / b for a, b in zip(agg["serve"], agg["upstream"])])
                lines.append(
                    f"| {t} | {clients} | {med(agg['serve']):.1f} | {med(agg['upstream']):.1f} | "
                    f"{med(agg['serve']) / med(agg['upstream']):.3f}x ({pairs:.3f}x) |"
                )
        if "ttft" in args.sections:
            lines += ttft_section(args, h, model, str(path), prompt_ids, banned)
    model.close()
    emit_report("server", lines, not args.no_save)


def ttft_section(
    args: argparse.Namespace,
    h: httpx.Client,
    model: llamaspec.Model,
    path: str,
    prompt_ids: list[int],
    banned: dict[int, float],
) -> list[str]:
    """Time to the first token, library vs serve, on short calls (2 tokens), many alternations; with
    the bare HTTP round trip of GET /health on the same connection for scale."""
    lines = [
        "",
        f"## Time to first token (2-token calls, {args.ttft_runs} alternations, median)",
        "",
        "| threads | library (ms) | serve (ms) | serve's added TTFT, median of pairs (ms) | "
        "GET /health round trip (ms) |",
        "| --- | --- | --- | --- | --- |",
    ]
    body = {"prompt": prompt_ids, "max_tokens": 2, "temperature": 0, "stream": True, "ignore_eos": True}
    for threads in args.threads:
        lib = llamaspec.MTP(model, n_draft=args.n_draft, n_ctx=1024, n_threads=threads)
        port = free_port()
        with serving(ours_cmd(path, port, threads, 1, args.n_draft), port) as url:

            def rtt() -> float:
                t0 = time.perf_counter()
                h.get(url + "/health")
                return time.perf_counter() - t0

            sides: dict[str, Callable[[], float]] = {
                "library": lambda: library_stream(lib, prompt_ids, 2, banned)[1],
                "serve": lambda: sse_stream(h, url + "/v1/completions", body, ours_text)[1],
                "rtt": rtt,
            }
            got = alternate(sides, args.ttft_runs)
        lib.close()
        added = med([(a - b) * 1e3 for a, b in zip(got["serve"], got["library"])])
        lines.append(
            f"| {threads} | {med(got['library']) * 1e3:.2f} | {med(got['serve']) * 1e3:.2f} | "
            f"{added:.2f} | {med(got['rtt']) * 1e3:.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    timed(main)
