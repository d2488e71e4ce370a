"""Every drafter CI can run, plain vs speculative, side by side in one run (and draft-simple and the
n-gram methods also against upstream's llama-speculative-simple built from the same pinned tree).

Cases (target model, method, drafter):
  mtp            speed fixture with an MTP head (~74% acceptance at n_draft 3)
  draft          speed fixture + a 2-layer llama draft model (tiny, ~85% acceptance by construction)
  eagle3         speed fixture + a hand-built EAGLE-3 head (100% by construction)
  dflash         speed fixture + a hand-built DFlash head (1 accepted token per verify by construction)
  dspark         speed fixture + a hand-built DSpark head (100% by construction)
  ngram-*        SmolLM2-135M Q4_1 (the test model) on a prompt that asks to repeat a list
  ngram-mod+mtp  speed fixture with an MTP head, chained

For each case and thread count: greedy tokens/s of llamaspec.Generator (plain) and
llamaspec.Speculative, alternating, --runs runs each, medians; acceptance from Speculative.stats().
Upstream (draft and ngram-* only): llama-completion (plain) and llama-speculative-simple with the same
method and limits; rates as in bench/mtp_speed.py (ours: (tokens - 1) / first-to-last-token time;
upstream speculative: its "decoded N tokens in T seconds").

Upstream's acceptance is not comparable where its llama-speculative-simple falls back to checkpoints
(a hybrid target like the qwen35 fixtures with draft-simple: it restores a checkpoint on partial
acceptance and retries the accepted prefix as a new draft, so only fully accepted drafts are
counted); ours is accepted / drafted over all drafts.

Usage: python bench/drafters.py [--runs 5] [--threads 1 2] [--tokens 128] [--n-draft 3]
       [--cases mtp draft ...] [--no-upstream]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llamaspec
from llamaspec_fixtures import (
    SPEED,
    write_dflash_fixture,
    write_draft_fixture,
    write_dspark_fixture,
    write_eagle3_fixture,
    write_qwen35_fixture,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mtp_speed import med, upstream_plain, upstream_speculative  # noqa: E402
from mtp_speed import ours_rate as rate  # noqa: E402
from upstream import build_tools, emit_report, timed  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REPETITIVE = (
    "Copy the list exactly, three times.\n"
    "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine\n"
    "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine\n"
    "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine\n"
)
NGRAM = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
# our ngram_options for SmolLM2 and the matching upstream flags (size_m / n_max are n_draft)
NGRAM_OPTS: dict[str, tuple[dict[str, int] | None, list[str]]] = {
    "ngram-simple": ({"size_n": 3}, ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "{nd}"]),
    "ngram-map-k": ({"size_n": 4}, ["--spec-ngram-map-k-size-n", "4", "--spec-ngram-map-k-size-m", "{nd}"]),
    "ngram-map-k4v": ({"size_n": 4}, ["--spec-ngram-map-k4v-size-n", "4", "--spec-ngram-map-k4v-size-m", "{nd}"]),
    "ngram-mod": ({"n_match": 8}, ["--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-max", "{nd}",
                                   "--spec-ngram-mod-n-min", "0"]),
    "ngram-cache": (None, []),
}


@dataclass
class Case:
    name: str
    target: str
    method: str | list[str]
    prompt: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    upstream: list[str] | None = None  # llama-speculative-simple arguments, None: no upstream run
    n_draft: int | None = None  # overrides --n-draft (ngram-cache: upstream always drafts up to 8)


def smollm2() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import smollm2_path

    return str(smollm2_path())


def build_cases(args: argparse.Namespace) -> list[Case]:
    d = args.fixtures
    d.mkdir(parents=True, exist_ok=True)
    mtp = write_qwen35_fixture(d / "speed-mtp-0.14.gguf", spec=SPEED, mtp_wrong_fraction=0.14)
    plain_t = write_qwen35_fixture(d / "speed-nomtp.gguf", spec=SPEED, mtp=False)
    draft = write_draft_fixture(d / "speed-draft-0.14.gguf", plain_t, wrong_fraction=0.14)
    heads = {k: w(d / f"speed-{k}.gguf", plain_t) for k, w in (
        ("eagle3", write_eagle3_fixture), ("dflash", write_dflash_fixture), ("dspark", write_dspark_fixture))}
    with llamaspec.Model(plain_t.path, vocab_only=True) as vm:
        cycle_prompt = vm.detokenize(plain_t.cycle[:8])  # on the cycle: every draft is as designed
    nd = str(args.n_draft)
    cases = [
        Case("mtp", mtp.path, "mtp", cycle_prompt),
        Case("draft", plain_t.path, "draft", cycle_prompt, {"draft_model": draft.path},
             ["-md", draft.path, "--spec-type", "draft-simple", "--spec-draft-n-max", nd, "--spec-draft-n-min", "0"]),
        *(Case(k, plain_t.path, k, cycle_prompt, {"draft_model": h.path}) for k, h in heads.items()),
        Case("ngram-mod+mtp", mtp.path, ["ngram-mod", "mtp"], cycle_prompt, {"ngram_options": {"n_match": 8}}),
    ]
    smol = smollm2()
    for m in NGRAM:
        opts, flags = NGRAM_OPTS[m]
        kw: dict[str, Any] = {"ngram_options": opts} if opts else {}
        cases.append(Case(m, smol, m, REPETITIVE, kw, ["--spec-type", m, *(f.format(nd=nd) for f in flags)],
                          n_draft=8 if m == "ngram-cache" else None))
    return [c for c in cases if not args.cases or c.name in args.cases]


def upstream_spec(bin_dir: Path, case: Case, n: int, threads: int, timeout: float) -> tuple[float, float]:
    assert case.upstream is not None
    return upstream_speculative(bin_dir, case.target, case.prompt, n, threads, case.upstream, timeout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--cases", nargs="*", default=[])
    ap.add_argument("--no-upstream", action="store_true")
    ap.add_argument("--fixtures", type=Path, default=ROOT / "build" / "fixtures")
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()

    bin_dir = None if args.no_upstream else build_tools("llama-completion", "llama-speculative-simple")
    rows = []
    for case in build_cases(args):
        model = llamaspec.Model(case.target)
        for threads in args.threads:
            gen = llamaspec.Generator(model, n_ctx=1024, n_threads=threads)
            spec = llamaspec.Speculative(model, method=case.method, n_draft=case.n_draft or args.n_draft, n_ctx=1024,
                                         n_threads=threads, **case.kwargs)
            gen.generate(case.prompt, 16, temperature=0)  # warm-up
            spec.generate(case.prompt, 16, temperature=0)
            assert spec.generate(case.prompt, args.tokens, temperature=0) == gen.generate(
                case.prompt, args.tokens, temperature=0) or case.target.endswith(".Q4_1.gguf"), case.name
            spec.reset_stats()
            with_up = bin_dir is not None and case.upstream is not None
            plain: list[float] = []
            ours: list[float] = []
            up_plain: list[float] = []
            up_runs: list[tuple[float, float]] = []
            for _ in range(args.runs):  # the four measurements of one run back to back
                plain.append(rate(gen, case.prompt, args.tokens))
                ours.append(rate(spec, case.prompt, args.tokens))
                if with_up:
                    assert bin_dir is not None
                    try:
                        u_plain = upstream_plain(bin_dir, case.target, case.prompt, args.tokens, threads, args.timeout)
                        u_spec = upstream_spec(bin_dir, case, args.tokens, threads, args.timeout)
                    except (subprocess.TimeoutExpired, RuntimeError) as e:
                        print(f"  {case.name} t={threads}: upstream run dropped ({type(e).__name__})", flush=True)
                        continue
                    up_plain.append(u_plain)
                    up_runs.append(u_spec)
            acc = spec.stats().acceptance_rate
            row: dict[str, Any] = dict(case=case.name, method=",".join(spec.methods), n_draft=spec.n_draft,
                                       threads=threads,
                                       plain=med(plain), ours=med(ours), acc=acc,
                                       paired=med([o / p for o, p in zip(ours, plain)]))
            spec.close()
            gen.close()
            if with_up and up_runs:
                row.update(up_plain=med(up_plain), up=med([r for r, _ in up_runs]),
                           acc_up=med([a for _, a in up_runs]))
            rows.append(row)
            up_txt = (f"  upstream {row['up']:7.1f} (plain {row['up_plain']:6.1f}, acc {row['acc_up']:.3f})"
                      if "up" in row else "")
            print(f"  {case.name:>14} t={threads}: plain {row['plain']:7.1f}  spec {row['ours']:7.1f}  "
                  f"x{row['ours'] / row['plain']:.2f} (pairs x{row['paired']:.2f})  acc {acc:.3f}{up_txt}", flush=True)
        model.close()

    lines = [
        f"greedy, {args.tokens} tokens, n_draft {args.n_draft}, median of {args.runs} alternating runs; fixtures: "
        f"qwen35 speed fixture ({SPEED.n_trunk} trunk layers, n_embd {SPEED.n_embd}, F16); n-gram methods: "
        "SmolLM2-135M-Instruct Q4_1 on a prompt that asks to repeat a list",
        "",
        "| case | stages | n_draft | threads | plain tok/s | speculative tok/s | **spec/plain** (medians / pairs) | acceptance "
        "| upstream plain | upstream spec | upstream spec/plain | **ours/upstream (spec)** | upstream acceptance |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        up = (f"{r['up_plain']:.1f} | {r['up']:.1f} | {r['up'] / r['up_plain']:.2f}x | **{r['ours'] / r['up']:.2f}x** "
              f"| {r['acc_up']:.3f}") if "up" in r else "— | — | — | — | —"
        lines.append(f"| {r['case']} | {r['method']} | {r['n_draft']} | {r['threads']} | {r['plain']:.1f} | {r['ours']:.1f} | "
                     f"**{r['ours'] / r['plain']:.2f}x** / {r['paired']:.2f}x | {r['acc']:.3f} | {up} |")
    emit_report("drafters", lines, save=not args.no_save)


if __name__ == "__main__":
    timed(main)
