"""The prompt cache on an 8-turn chat, side by side in one run.

A conversation of --turns turns: each turn appends a user message of about --user tokens to the
history (the previous prompt and its --tokens generated tokens), and generates --tokens tokens
(greedy, end-of-generation banned so every turn does the same work). The history grows to about
turns * (user + tokens) tokens. Prompts are token ids, fixed once (from the cached library run), so
every side decodes the same prompts.

- library: per turn, the time to the first token with the prompt cache (a session that keeps its
  cache), without it (cache_prompt=False), and the ideal: decoding only the new tokens on a context
  that already holds the history (Context.decode, timed for the new part alone, plus nothing else).
  "of which prefill" is the cached call's own prompt time (GenerationStats.prefill_time); with MTP
  the rest of its time to the first token is the first pass (the held-back last prompt token, no
  draft: ADR 0014), which the ideal decodes with the rest of the new tokens.
  Also the whole conversation's time with and without the cache, the checkpoint bytes
  (Session.prompt_cache()) and the process's RSS.
- servers: `llamaspec serve` and llama-server (built from the same pinned tree), -np 1, both with
  their prompt cache on (llama-server's default cache_prompt and --ctx-checkpoints), /completion
  with the turn's token ids, streamed: the client's time to the first token per turn. Each run
  starts its conversation with another first message, so no run reuses the one before.

- switch (host-memory cache): two such conversations taking turns on one sequence (A1 B1 A2 B2
  ...), so each turn finds the other conversation in the sequence. Library: time to the first token
  with prompt_cache_mb=1024 (the other conversation's state is saved and loaded back) against 0
  (only the sequence's own cache, so each turn decodes its whole history); servers: `llamaspec
  serve` against llama-server, -np 1, both with their default --cache-ram 8192.
- repeat: one late turn, many times: the last turn's history cached, each request adding another
  user message to it (a first token only), on the library, `llamaspec serve` and llama-server, in
  --runs rounds of fresh instances with --repeats requests a side each, the order rotating request
  by request: the per-turn comparison with many samples and several instances of each side. Each
  side's own prompt time (the library's prefill_time, the servers' timings.prompt_ms) and the rest
  of its time to the first token are shown apart, to see where a difference lies.

On SmolLM2 (plain decoding) and on the MTP speed fixture (qwen35 hybrid, MTP n_draft 3). Sides
alternate within every turn; medians over --runs.

Usage: python bench/prompt_cache.py [--runs 3] [--threads 1 2] [--models smollm2 mtp]
       [--sections library server switch repeat] [--turns 8] [--user 150] [--tokens 64] [--repeats 9]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

import llamaspec
from llamaspec_fixtures import SPEED, write_qwen35_fixture

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med  # noqa: E402
from plain_decode import eog_bias, smollm2  # noqa: E402
from upstream import build_tools, emit_report, free_port, serving, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("river mountain question answer careful window garden history number silver market "
         "evening bridge letter winter summer travel music quiet story paper engine forest").split()


def user_message(model: llamaspec.Model, rng: random.Random, n_tokens: int, fixture: bool) -> list[int]:
    """About n_tokens tokens of a user turn (words for a real model, ids on the fixture's cycle)."""
    if fixture:
        return [rng.randrange(4, model.n_vocab) for _ in range(n_tokens)]
    ids: list[int] = []
    while len(ids) < n_tokens:
        sentence = " ".join(rng.choice(WORDS) for _ in range(12)) + ". "
        ids += model.tokenize(sentence, add_special=False)
    return ids[:n_tokens]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def wait_out_polling() -> None:
    """After a decode, ggml's worker threads poll for new work (~0.18 s of CPU here at 2 threads)
    before they sleep. Our sessions pause their pools when idle; a bare Context and llama-server do
    not. Wait them out after those, or the side timed next shares its cores with them (that made
    every other turn 2.2x the ideal, and serve/llama-server 1.1-1.2x, at 2 threads)."""
    time.sleep(0.3)


def ttft_call(session: llamaspec.Generator | llamaspec.Speculative, prompt: list[int], n: int,
              banned: dict[int, float], cache: bool) -> tuple[float, list[int], llamaspec.GenerationStats]:
    """(seconds to the first token, the generated ids, the call's stats)."""
    t0 = time.perf_counter()
    first = 0.0
    ids: list[int] = []
    stats = None
    for ev in session.stream_events(prompt, n, temperature=0, logit_bias=banned, cache_prompt=cache):
        if isinstance(ev, llamaspec.Token):
            if not ids:
                first = time.perf_counter() - t0
            ids.append(ev.id)
        elif isinstance(ev, llamaspec.Done):
            stats = ev.stats
    assert stats is not None
    return first, ids, stats


class Ideal:
    """The lower bound of a turn's time to the first token: decoding only its new tokens on a context
    that already holds the history (no engine, no sampling). One context follows the conversation,
    decoding (untimed) what the last turn added, as the cached session's memory does."""

    def __init__(self, model: llamaspec.Model, threads: int, n_ctx: int) -> None:
        self.ctx = llamaspec.Context(model, n_ctx=n_ctx, n_threads=threads)
        self.held: list[int] = []

    def time(self, history: list[int], new: list[int]) -> float:
        if self.held != history[: len(self.held)] or not self.held:
            self.ctx.decode(new[:1], 0)  # warm-up, and position 0 starts afresh
            self.ctx.clear()
            self.held = []
        if len(history) > len(self.held):
            self.ctx.decode(history[len(self.held):], len(self.held))
        t0 = time.perf_counter()
        self.ctx.decode(new, len(history))
        elapsed = time.perf_counter() - t0
        self.held = history + new
        wait_out_polling()  # a bare Context does not pause its pool
        return elapsed

    def close(self) -> None:
        self.ctx.close()


def make_session(kind: str, model: llamaspec.Model, threads: int, n_ctx: int,
                 ram_mb: int = 0) -> llamaspec.Generator | llamaspec.Speculative:
    if kind == "mtp":
        return llamaspec.MTP(model, n_draft=3, n_ctx=n_ctx, n_threads=threads, prompt_cache_mb=ram_mb)
    return llamaspec.Generator(model, n_ctx=n_ctx, n_threads=threads, prompt_cache_mb=ram_mb)


def conversation(model: llamaspec.Model, kind: str, seed: int, args: argparse.Namespace,
                 banned: dict[int, float]) -> list[list[int]]:
    """The prompts of one conversation: each turn's history comes from a cached library run."""
    rng = random.Random(seed)
    fixture = kind == "mtp"
    prompts: list[list[int]] = []
    history: list[int] = []
    with make_session(kind, model, 2, args.n_ctx) as s:
        for _ in range(args.turns):
            prompt = history + user_message(model, rng, args.user, fixture)
            _, gen, _ = ttft_call(s, prompt, args.tokens, banned, True)
            prompts.append(prompt)
            history = prompt + gen
    return prompts


def library_section(model: llamaspec.Model, kind: str, args: argparse.Namespace, banned: dict[int, float],
                    lines: list[str]) -> None:
    prompts = conversation(model, kind, 0, args, banned)
    lines += ["", f"### library, {kind}: {len(prompts)} turns, last prompt {len(prompts[-1])} tokens", "",
              "| threads | turn | prompt | cached | TTFT cached (ms) | of which prefill (ms) "
              "| TTFT uncached (ms) | ideal (ms) | cached/ideal | prefill/ideal | uncached/cached |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    totals: list[str] = []
    for threads in args.threads:
        per_turn: list[dict[str, list[float]]] = [{"c": [], "p": [], "u": [], "i": []} for _ in prompts]
        cached_n = [0] * len(prompts)
        tot_c: list[float] = []
        tot_u: list[float] = []
        ck_bytes = 0
        rss0 = rss_mb()
        for run in range(args.runs):
            with make_session(kind, model, threads, args.n_ctx) as cached, \
                    make_session(kind, model, threads, args.n_ctx) as fresh:
                lower = Ideal(model, threads, args.n_ctx)
                warm = [(prompts[0][0] + 1) % model.n_vocab] * 2  # a token no prompt starts with
                for s in (cached, fresh):
                    s.generate(warm, 2, temperature=0)
                t_c = t_u = 0.0
                for k, prompt in enumerate(prompts):
                    prev = prompts[k - 1] if k else []
                    order = [True, False] if (run + k) % 2 == 0 else [False, True]
                    for use_cache in order:
                        s = cached if use_cache else fresh
                        t0 = time.perf_counter()
                        first, _, st = ttft_call(s, prompt, args.tokens, banned, use_cache)
                        whole = time.perf_counter() - t0
                        if use_cache:
                            per_turn[k]["c"].append(first)
                            per_turn[k]["p"].append(st.prefill_time)
                            cached_n[k] = st.cached_tokens
                            t_c += whole
                        else:
                            per_turn[k]["u"].append(first)
                            t_u += whole
                    # the ideal: the part this turn adds to what the cache holds (the history as the
                    # last call left it: the previous prompt and all but the last generated token)
                    base = prompt[:cached_n[k]] if cached_n[k] else prompt[: len(prev)]
                    per_turn[k]["i"].append(lower.time(base, prompt[len(base):]))
                lower.close()
                tot_c.append(t_c)
                tot_u.append(t_u)
                ck_bytes = sum(c.checkpoint_bytes for c in cached.prompt_cache())
        for k, prompt in enumerate(prompts):
            c, p, u, i = (med(per_turn[k][x]) for x in "cpui")
            lines.append(f"| {threads} | {k + 1} | {len(prompt)} | {cached_n[k]} | {c * 1e3:.1f} "
                         f"| {p * 1e3:.1f} | {u * 1e3:.1f} | {i * 1e3:.1f} | {c / i:.2f} | {p / i:.2f} "
                         f"| {u / c:.2f} |")
        totals.append(f"- {threads} thread(s): whole conversation {med(tot_c):.2f} s with the cache, "
                      f"{med(tot_u):.2f} s without: {med(tot_u) / med(tot_c):.2f}x; checkpoints "
                      f"{ck_bytes / 1e6:.2f} MB; RSS {rss0:.0f} -> {rss_mb():.0f} MB")
    lines += [""] + totals


def sse_ttft(h: httpx.Client, url: str, body: dict[str, object]) -> tuple[float, int]:
    """(seconds to the first text chunk, the server's cache_n from the last chunk's timings)."""
    first, cache_n, _ = sse_ttft_prompt(h, url, body)
    return first, cache_n


def sse_ttft_prompt(h: httpx.Client, url: str, body: dict[str, object]) -> tuple[float, int, float]:
    """sse_ttft, and the server's own prompt time (timings.prompt_ms, in seconds)."""
    t0 = time.perf_counter()
    first = float("nan")
    cache_n = -1
    prompt_s = float("nan")
    for attempt in range(2):
        try:
            with h.stream("POST", url + "/completion", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("content") and first != first:
                        first = time.perf_counter() - t0
                    if "timings" in chunk:
                        cache_n = int(chunk["timings"].get("cache_n", -1))
                        prompt_s = float(chunk["timings"].get("prompt_ms", "nan")) / 1e3
            return first, cache_n, prompt_s
        except httpx.RemoteProtocolError:  # a kept-alive connection the server closed while idle
            if attempt:
                raise
            t0 = time.perf_counter()
    return first, cache_n, prompt_s


def switching(model: llamaspec.Model, kind: str, seed: int, args: argparse.Namespace,
              banned: dict[int, float]) -> list[list[int]]:
    """Two conversations taking turns: A1 B1 A2 B2 ..."""
    a, b = (conversation(model, kind, seed + i, args, banned) for i in (0, 1))
    return [p for pair in zip(a, b) for p in pair]


def switch_library(model: llamaspec.Model, kind: str, args: argparse.Namespace, banned: dict[int, float],
                   lines: list[str]) -> None:
    prompts = switching(model, kind, 200, args, banned)
    lines += ["", f"### switch, library, {kind}: two conversations taking turns on one sequence", "",
              "| threads | turn | prompt | cached, ram | TTFT ram (ms) | cached, no ram | TTFT no ram (ms) "
              "| no ram/ram |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    totals: list[str] = []
    for threads in args.threads:
        res: dict[int, list[list[float]]] = {mb: [[] for _ in prompts] for mb in (1024, 0)}
        cached = {mb: [0] * len(prompts) for mb in (1024, 0)}
        tot: dict[int, list[float]] = {1024: [], 0: []}
        ram_mb = 0.0
        for run in range(args.runs):
            with make_session(kind, model, threads, args.n_ctx, 1024) as on, \
                    make_session(kind, model, threads, args.n_ctx, 0) as off:
                sessions = {1024: on, 0: off}
                warm = [(prompts[0][0] + 1) % model.n_vocab] * 2  # a token no prompt starts with
                for s in (on, off):
                    s.generate(warm, 2, temperature=0)
                t = {1024: 0.0, 0: 0.0}
                for k, prompt in enumerate(prompts):
                    for mb in (1024, 0) if (run + k) % 2 == 0 else (0, 1024):
                        t0 = time.perf_counter()
                        first, _, st = ttft_call(sessions[mb], prompt, args.tokens, banned, True)
                        cached[mb][k] = st.cached_tokens
                        t[mb] += time.perf_counter() - t0
                        res[mb][k].append(first)
                for mb in t:
                    tot[mb].append(t[mb])
                ram_mb = on.prompt_cache_ram().bytes / 1e6
        for k, prompt in enumerate(prompts):
            a, b = med(res[1024][k]), med(res[0][k])
            lines.append(f"| {threads} | {'AB'[k % 2]}{k // 2 + 1} | {len(prompt)} | {cached[1024][k]} "
                         f"| {a * 1e3:.1f} | {cached[0][k]} | {b * 1e3:.1f} | {b / a:.2f} |")
        on, off = med(tot[1024]), med(tot[0])
        totals.append(f"- {threads} thread(s): both conversations {on:.2f} s with prompt_cache_mb=1024, "
                      f"{off:.2f} s with 0: {off / on:.2f}x; host cache at the end {ram_mb:.1f} MB")
    lines += [""] + totals


@contextlib.contextmanager
def both_servers(path: str, kind: str, threads: int, args: argparse.Namespace,
                 bin_dir: Path) -> Iterator[tuple[str, str]]:
    """`llamaspec serve` and llama-server with the same flags (-np 1, their prompt caches on); yields
    their URLs. The callers warm them up."""
    mtp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-n-min", "0"]
    spec = mtp if kind == "mtp" else []

    def flags(port: int) -> list[str]:
        return ["-m", path, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                "-tb", str(threads), "-c", str(args.n_ctx), "-np", "1", *spec]

    po, pu = free_port(), free_port()
    ours = [sys.executable, "-m", "llamaspec", "serve", *flags(po)]
    up = [str(bin_dir / "llama-server"), *flags(pu), "--no-webui"]
    with serving(ours, po) as ours_url, serving(up, pu) as up_url:
        yield ours_url, up_url


def server_section(path: str, model: llamaspec.Model, kind: str, args: argparse.Namespace, bin_dir: Path,
                   banned: dict[int, float], lines: list[str], switch: bool = False) -> None:
    what = "two conversations taking turns, --cache-ram 8192" if switch else "one conversation"
    lines += ["", f"### servers, {kind}, {what}: client's time to the first token per turn (ms), -np 1", "",
              "| threads | turn | prompt | serve cached | serve TTFT | llama-server cached "
              "| llama-server TTFT | serve/llama-server |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    if switch:
        convs = [switching(model, kind, 300 + 2 * r, args, banned) for r in range(args.runs)]
    else:
        convs = [conversation(model, kind, 100 + r, args, banned) for r in range(args.runs)]
    n_turns = len(convs[0])
    for threads in args.threads:
        res: dict[str, list[list[float]]] = {side: [[] for _ in range(n_turns)] for side in "ou"}
        cache: dict[str, list[int]] = {"o": [0] * n_turns, "u": [0] * n_turns}
        with both_servers(path, kind, threads, args, bin_dir) as (ours_url, up_url), \
                httpx.Client(timeout=600) as h:
            warm = [(convs[0][0][0] + 1) % model.n_vocab] * 2  # a token no prompt starts with
            for url in (ours_url, up_url):
                sse_ttft(h, url, {"prompt": warm, "n_predict": 2, "stream": True})
            for r, prompts in enumerate(convs):
                for k, prompt in enumerate(prompts):
                    body = {"prompt": prompt, "n_predict": args.tokens, "temperature": 0,
                            "stream": True, "ignore_eos": True, "cache_prompt": True}
                    sides = [("o", ours_url), ("u", up_url)]
                    for side, url in sides if (r + k) % 2 == 0 else sides[::-1]:
                        t, n = sse_ttft(h, url, body)
                        res[side][k].append(t)
                        cache[side][k] = n
                        wait_out_polling()  # llama-server does not pause its pools; a machine runs one server
        for k in range(n_turns):
            o, u = med(res["o"][k]), med(res["u"][k])
            turn = f"{'AB'[k % 2]}{k // 2 + 1}" if switch else str(k + 1)
            lines.append(f"| {threads} | {turn} | {len(convs[0][k])} | {cache['o'][k]} | {o * 1e3:.1f} "
                         f"| {cache['u'][k]} | {u * 1e3:.1f} | {o / u:.2f} |")


def repeat_section(path: str, model: llamaspec.Model, kind: str, args: argparse.Namespace, bin_dir: Path,
                   banned: dict[int, float], lines: list[str]) -> None:
    """One late turn many times: the history of the conversation's last turn is cached, and each
    request adds another user message to it, so each side decodes the same new tokens on the same
    cached history, request after request. The sides are the library (a session as in the library
    section, prompt_cache_mb=0, in this process), `llamaspec serve` and llama-server.

    Each of --runs rounds starts all three afresh: one instance keeps its speed for its lifetime,
    5-15% apart from an identical one (four identical MTP sessions in one process: 281-320 ms, each
    a median of 24 requests; two serve processes 323 and 349 ms, two llama-servers 329 and 330), so
    one instance per side compares instances, not programs. In a round the order rotates (lou, oul,
    ulo), so each side runs first, second and third equally often."""
    history = conversation(model, kind, 0, args, banned)[-1]
    rng = random.Random(7)
    n = args.repeats
    messages = [user_message(model, rng, args.user, kind == "mtp") for _ in range(n)]
    lines += ["", f"### servers, {kind}, one turn repeated: {len(history)} tokens of history cached, "
              f"{args.runs} rounds of fresh instances, {n} requests a side each adding a {args.user}-token "
              "message", "",
              "ratio: the median over rounds of the round's ratio of medians (lowest-highest round)", "",
              "| threads | cached: library / serve / llama-server | TTFT library (ms) | serve (ms) "
              "| llama-server (ms) | serve/llama-server | serve/library | library/llama-server "
              "| prompt time: library / serve / llama-server (ms) "
              "| after it: library / serve / llama-server (ms) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    orders = ["lou", "oul", "ulo"]
    for threads in args.threads:
        got: dict[str, list[float]] = {"l": [], "o": [], "u": []}
        prompt_s: dict[str, list[float]] = {"l": [], "o": [], "u": []}  # each side's own prompt time
        rounds: list[dict[str, float]] = []
        cache = {"l": 0, "o": 0, "u": 0}
        for _ in range(args.runs):
            mine: dict[str, list[float]] = {"l": [], "o": [], "u": []}
            with both_servers(path, kind, threads, args, bin_dir) as (ours_url, up_url), \
                    httpx.Client(timeout=600) as h, make_session(kind, model, threads, args.n_ctx) as lib:

                def one(side: str, prompt: list[int]) -> tuple[float, int, float]:
                    if side == "l":
                        t, _, st = ttft_call(lib, prompt, 1, banned, True)
                        cached, own = st.cached_tokens, st.prefill_time
                    else:
                        body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "stream": True,
                                "cache_prompt": True}
                        t, cached, own = sse_ttft_prompt(h, ours_url if side == "o" else up_url, body)
                    wait_out_polling()  # every side gets the same pause before the next one
                    return t, cached, own

                for side in "lou":
                    one(side, history)
                for k, msg in enumerate(messages):
                    for side in orders[k % 3]:
                        t, cache[side], own = one(side, history + msg)
                        mine[side].append(t)
                        prompt_s[side].append(own)
            for side in mine:
                got[side] += mine[side]
            rounds.append({side: med(mine[side]) for side in mine})
        m = {side: med(got[side]) for side in got}
        p = {side: med(prompt_s[side]) for side in got}
        after = {side: med([t - q for t, q in zip(got[side], prompt_s[side])]) for side in got}

        def ratio(a: str, b: str) -> str:
            per = sorted(r[a] / r[b] for r in rounds)
            return f"{med(per):.3f} ({per[0]:.3f}-{per[-1]:.3f})"

        lines.append(f"| {threads} | {cache['l']} / {cache['o']} / {cache['u']} | {m['l'] * 1e3:.1f} "
                     f"| {m['o'] * 1e3:.1f} | {m['u'] * 1e3:.1f} | {ratio('o', 'u')} | {ratio('o', 'l')} "
                     f"| {ratio('l', 'u')} | {p['l'] * 1e3:.1f} / {p['o'] * 1e3:.1f} / {p['u'] * 1e3:.1f} "
                     f"| {after['l'] * 1e3:.1f} / {after['o'] * 1e3:.1f} / {after['u'] * 1e3:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", choices=["smollm2", "mtp"], default=["smollm2", "mtp"])
    ap.add_argument("--sections", nargs="+", choices=["library", "server", "switch", "repeat"],
                    default=["library", "server", "switch", "repeat"])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--user", type=int, default=150)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9, help="requests a side per round in the repeat section")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    servers = bool({"server", "switch", "repeat"} & set(args.sections))
    bin_dir = build_tools("llama-server") if servers else Path()
    lines = [f"{args.turns} turns of a {args.user}-token user message and {args.tokens} generated tokens "
             f"(greedy, end-of-generation banned); medians of {args.runs} runs; sides alternate per turn."]
    for kind in args.models:
        if kind == "mtp":
            args.fixtures.mkdir(parents=True, exist_ok=True)
            path = args.fixtures / "speed-mtp-0.14.gguf"
            write_qwen35_fixture(path, spec=SPEED, mtp_wrong_fraction=0.14)
            path_s = str(path)
        else:
            path_s = smollm2()
        with llamaspec.Model(path_s) as model:
            banned = eog_bias(model)
            lines += ["", f"## {kind}: {Path(path_s).name}"]
            if "library" in args.sections:
                library_section(model, kind, args, banned, lines)
            if "server" in args.sections:
                server_section(path_s, model, kind, args, bin_dir, banned, lines)
            if "switch" in args.sections:
                switch_library(model, kind, args, banned, lines)
                server_section(path_s, model, kind, args, bin_dir, banned, lines, switch=True)
            if "repeat" in args.sections:
                repeat_section(path_s, model, kind, args, bin_dir, banned, lines)
    emit_report("prompt_cache", lines, not args.no_save)


if __name__ == "__main__":
    timed(main)
