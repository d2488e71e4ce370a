"""Embeddings: Model.embed against llama.cpp's llama-embedding on the same model, texts and threads.

Cases:
  bert-minilm  a BERT-architecture GGUF with MiniLM-L6's shape (6 layers, 384 wide, 12 heads, 512
               positions, F32, random weights: llamaspec_fixtures.write_bert_fixture), mean pooling,
               context 512 on both sides.
  smollm2      SmolLM2-135M Q4_1 (a decoder), mean pooling, context 8192 on both sides.
1,000 sentences of 6-40 words from a fixed word list (seeded). Ours: Model.embed over all of them in
one call (tokenizing included; the embedding context made by a warm-up call first), timed around the
call. Upstream: llama-embedding built from the same pinned tree (bench/upstream.py) with the same
context, batch, threads and pooling, timed two ways: the wall clock of its run over all texts less
its run over the first alone (model load, context and exit cancel out; its printing of the vectors
as JSON stays in, which favours us), and its own decode measure, llama_perf_context_print's "prompt
eval time" (only the compute: its batch preparation and graph building are left out while ours are
in, which favours it; on a decoder model it does not wait for the compute and reads near zero).
Tokens/s = the texts' tokens / time. The two sides alternate, --runs rounds; medians of the rates
and of the per-round ratios. The goal (issue 18): ours >= 0.95x llama-embedding.

Usage: python bench/embeddings.py [--runs 5] [--threads 1 2] [--sentences 1000]
       [--cases bert-minilm smollm2]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llamaspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_decode import smollm2  # noqa: E402
from upstream import build_tools, emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("the quick brown fox jumps over a lazy dog while rivers run through old cities and bright "
         "stars shine above quiet hills where people walk talk read write think about music art "
         "science history water light time language model vector search").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 40))).capitalize() + "."
            for _ in range(n)]


def ours(model: llamaspec.Model, texts: list[str], threads: int, n_ctx: int, pooling: str) -> float:
    t0 = time.perf_counter()
    model.embed(texts, pooling=pooling, n_threads=threads, n_ctx=n_ctx)
    return time.perf_counter() - t0


def upstream_run(exe: Path, path: str, prompt_file: Path, threads: int, n_ctx: int,
                 pooling: str) -> tuple[float, float]:
    """(wall seconds of one llama-embedding run, its own "prompt eval time" in seconds). Its batch is
    its context (as ours); its ubatch the batch for a non-causal model, llama.cpp's default (512)
    for a decoder (as ours)."""
    t0 = time.perf_counter()
    r = subprocess.run([str(exe), "-m", path, "-f", str(prompt_file), "-t", str(threads), "-c", str(n_ctx),
                        "-b", str(n_ctx), "--pooling", pooling, "--perf", "--verbose",
                        "--embd-output-format", "array"],
                       check=True, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    m = re.search(r"prompt eval time =\s*([0-9.]+) ms", r.stdout + r.stderr)
    return wall, float(m.group(1)) / 1e3 if m else float("nan")


def upstream(exe: Path, path: str, files: tuple[Path, Path], threads: int, n_ctx: int,
             pooling: str) -> tuple[float, float]:
    """llama-embedding's seconds for all texts but the first, two ways: wall clock (its run over all
    texts less its run over the first alone: load, context and exit cancel out, its printing of the
    vectors stays in) and its own decode measure (batch preparation and graph building left out)."""
    wall_all, perf = upstream_run(exe, path, files[0], threads, n_ctx, pooling)
    wall_one, _ = upstream_run(exe, path, files[1], threads, n_ctx, pooling)
    return wall_all - wall_one, perf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--cases", nargs="+", default=["bert-minilm", "smollm2"])
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    exe = build_tools("llama-embedding") / "llama-embedding"
    texts = sentences(args.sentences)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = (Path(tmp) / "sentences.txt", Path(tmp) / "first.txt")
        files[0].write_text("\n".join(texts))
        files[1].write_text(texts[0])
        for case in args.cases:
            if case == "bert-minilm":
                from llamaspec_fixtures import write_bert_fixture

                path = args.fixtures / "bert-minilm-shape.gguf"
                if not path.exists():
                    args.fixtures.mkdir(parents=True, exist_ok=True)
                    write_bert_fixture(path, n_embd=384, n_layer=6, n_head=12, n_ff=1536, n_ctx_train=512)
                model_path, n_ctx = str(path), 512
            else:
                model_path, n_ctx = smollm2(), 8192
            model = llamaspec.Model(model_path)
            n_tokens = sum(len(model.tokenize(t)) for t in texts)
            first_tokens = len(model.tokenize(texts[0]))
            for threads in args.threads:
                model.embed(texts[:8], pooling="mean", n_threads=threads, n_ctx=n_ctx)  # the context, once
                rates: dict[str, list[float]] = {"ours": [], "wall": [], "perf": []}
                for i in range(args.runs):
                    for side in (["ours", "upstream"] if i % 2 == 0 else ["upstream", "ours"]):
                        if side == "ours":
                            rates["ours"].append(n_tokens / ours(model, texts, threads, n_ctx, "mean"))
                        else:
                            wall, perf = upstream(exe, model_path, files, threads, n_ctx, "mean")
                            rates["wall"].append((n_tokens - first_tokens) / wall)
                            rates["perf"].append(n_tokens / perf)
                row: dict[str, object] = {"case": case, "threads": threads, "tokens": n_tokens}
                for k in rates:
                    row[k] = statistics.median(rates[k])
                for k in ("wall", "perf"):
                    ratio = [a / b for a, b in zip(rates["ours"], rates[k])]
                    row[f"r_{k}"] = (statistics.median(ratio), min(ratio), max(ratio))
                rows.append(row)
                print(f"  {case} t={threads}: ours {row['ours']:.0f} tok/s, llama-embedding "
                      f"{row['wall']:.0f} (wall) / {row['perf']:.0f} (its decode measure) tok/s", flush=True)
            model.close()
    lines = [
        f"{args.sentences} sentences, mean pooling, normalized; medians of {args.runs} rounds (both sides "
        "once per round, alternating order). Ours: the whole Model.embed call (tokenizing included). "
        "llama-embedding: wall = its run over all texts less its run over the first (its printing of the "
        "vectors stays in); decode = its own prompt eval time (only compute; it undercounts a decoder "
        "model's decode, whose compute it does not wait for, so that column is void for smollm2).",
        "",
        "| case | threads | tokens | ours tok/s | upstream tok/s (wall) | upstream tok/s (decode) "
        "| **ours / upstream wall** (min-max) | ours / upstream decode (min-max) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        w, p = r["r_wall"], r["r_perf"]
        assert isinstance(w, tuple) and isinstance(p, tuple)
        lines.append(f"| {r['case']} | {r['threads']} | {r['tokens']} | {r['ours']:.0f} | {r['wall']:.0f} "
                     f"| {r['perf']:.0f} | **{w[0]:.3f}x** ({w[1]:.3f}-{w[2]:.3f}) "
                     f"| {p[0]:.3f}x ({p[1]:.3f}-{p[2]:.3f}) |")
    emit_report("embeddings", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
