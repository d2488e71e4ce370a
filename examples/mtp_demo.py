"""MTP speculative decoding, live: plain vs MTP side by side, with tokens/s and acceptance as they happen.

Without arguments it writes the 86 MB qwen35 speed fixture (an MTP model whose acceptance is set by
construction; cached in ~/.cache/llamaspec/fixtures) for 100%, ~74% and 0% acceptance, streams plain and
MTP generation on each, and prints a table. With a real MTP GGUF (e.g. a Qwen3.5/3.6 "-MTP" quant):

    python examples/mtp_demo.py --model Qwen3.6-35B-A3B-MTP-Q4_K_M.gguf --chat "Why is the sky blue?"

applies the model's chat template and streams the answer with live statistics. Any other drafter:

    python examples/mtp_demo.py --model Qwen3-8B-Q4_K_M.gguf --method draft --draft-model Qwen3-0.6B-Q8_0.gguf
    python examples/mtp_demo.py --model Qwen3-8B-Q4_K_M.gguf --method ngram-mod
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import statistics
from pathlib import Path
from typing import Literal

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

import llamaspec

LEVELS = {"100%": 0.0, "~74%": 0.14, "0%": 1.0}


class LiveStats:
    """A renderable that reads the session's statistics each time rich refreshes: from rich's own
    refresh thread, while the generation runs on the native worker."""

    def __init__(self, label: str, mtp: llamaspec.Speculative | None) -> None:
        self.label, self.mtp = label, mtp
        self.tokens, self.rate = 0, 0.0

    def __rich__(self) -> Text:
        line = f"{self.label:<12} {self.tokens:5d} tokens  {self.rate:7.1f} tok/s"
        if self.mtp is not None:
            s = self.mtp.stats()
            line += (f"  acceptance {100 * s.acceptance_rate:5.1f}%  mean accepted length "
                     f"{s.mean_accepted_length:4.2f}  iterations {s.iterations}")
        return Text(line, style="cyan")


def stream(console: Console, label: str, session: llamaspec.Generator | llamaspec.Speculative, prompt: str | list[int],
           max_tokens: int, show_text: bool, **sampling: object) -> llamaspec.GenerationStats:
    stats = LiveStats(label, session if isinstance(session, llamaspec.Speculative) else None)
    text = Text()
    done: llamaspec.GenerationStats | None = None
    with Live(Group(text, stats) if show_text else stats, console=console, refresh_per_second=10,
              transient=False):
        for ev in session.stream_events(prompt, max_tokens, **sampling):  # type: ignore[arg-type]
            if isinstance(ev, llamaspec.Token):
                stats.tokens += 1
                if show_text:
                    text.append(ev.text)
            elif isinstance(ev, llamaspec.Done):
                stats.rate = ev.stats.tokens_per_second
                done = ev.stats
    if not console.is_terminal:
        console.print()  # a non-interactive Live leaves its last line open
    if done is None:
        raise RuntimeError("the generation ended without Done")
    return done


def n_draft_arg(value: str) -> int | Literal["auto"]:
    return "auto" if value == "auto" else int(value)


def fixture_demo(console: Console, args: argparse.Namespace) -> None:
    from llamaspec_fixtures import SPEED, write_qwen35_fixture

    cache = Path(os.environ.get("LLAMASPEC_CACHE_DIR", Path.home() / ".cache" / "llamaspec")) / "fixtures"
    cache.mkdir(parents=True, exist_ok=True)
    # MTP as a user gets it without setting anything (n_draft="auto"), and at a fixed length; every
    # session first generates one untimed call of the same length (the default learns from it), then
    # the sessions take turns, --runs times, and the table shows each one's median
    first = "default" if args.n_draft == "auto" else f"fixed {args.n_draft}"
    lengths: dict[str, int | Literal["auto"]] = {first: args.n_draft}
    if args.fixed:
        lengths[f"fixed {args.fixed}"] = args.fixed
    table = Table(title=f"tok/s on the speed fixture: plain vs MTP ({args.tokens} tokens, greedy, "
                        f"{args.threads} thread(s), median of {args.runs} runs after a warm-up call)")
    table.add_column("level", justify="right")
    table.add_column("plain", justify="right")
    for label in lengths:
        table.add_column(label, justify="right")
        table.add_column("x plain", justify="right")
        table.add_column("acc/len", justify="right")
    for level, wrong in LEVELS.items():
        path = cache / f"speed-mtp-{wrong}.gguf"
        info = write_qwen35_fixture(path, spec=SPEED, mtp_wrong_fraction=wrong) if not path.exists() else None
        with llamaspec.Model(path) as model:
            if info is None:
                from llamaspec_fixtures import fixture_next_map

                cycle, _ = fixture_next_map(1234)
            else:
                cycle = info.cycle
            prompt = model.detokenize(cycle[:8])
            console.rule(f"acceptance built for: {level}")
            sessions: dict[str, llamaspec.Generator | llamaspec.Speculative] = {
                "plain": llamaspec.Generator(model, n_ctx=1024, n_threads=args.threads)}
            for label, n_draft in lengths.items():
                sessions[label] = llamaspec.MTP(model, n_draft=n_draft, n_ctx=1024, n_threads=args.threads)
            rates: dict[str, list[float]] = {label: [] for label in sessions}
            try:
                for session in sessions.values():
                    session.generate(prompt, args.tokens, temperature=0)  # warm-up (what "auto" learns from)
                    if isinstance(session, llamaspec.Speculative):
                        session.reset_stats()
                for _ in range(args.runs):
                    for label, session in sessions.items():
                        done = stream(console, f"MTP {label}" if label != "plain" else label, session, prompt,
                                      args.tokens, False, temperature=0)
                        rates[label].append(done.tokens_per_second)
                plain = statistics.median(rates["plain"])
                row = [level, f"{plain:.1f}"]
                for label in lengths:
                    rate = statistics.median(rates[label])
                    st = sessions[label].stats()
                    row += [f"{rate:.1f}", f"{rate / plain:.2f}x",
                            f"{100 * st.acceptance_rate:.0f}%/{st.mean_draft_length:.1f}"]
                table.add_row(*row)
            finally:
                for session in sessions.values():
                    session.close()
    console.print(table)
    console.print("fixed k: n_draft=k. acc/len: the share of drafted tokens accepted / draft tokens per verify "
                  "(0: every step was plain). The default chooses each verify's length from what it measures "
                  "(ADR 0009).")
    if args.bench:
        # the same comparison from the command line, as a user runs it on their own model
        path = cache / f"speed-mtp-{LEVELS['~74%']}.gguf"
        with llamaspec.Model(path, vocab_only=True) as vm:
            from llamaspec_fixtures import fixture_next_map

            prompt = vm.detokenize(fixture_next_map(1234)[0][:8])
        cmd = ["llamaspec", "bench", str(path), "--raw", "-p", prompt, "-n", str(args.tokens),
               "-r", str(args.runs), "-t", str(args.threads), "--n-draft", "auto", str(args.fixed or 3)]
        console.rule("the same measurement with llamaspec bench (~74% acceptance)")
        console.print("$ " + " ".join(shlex.quote(c) for c in cmd))
        subprocess.run([sys.executable, "-m", "llamaspec", *cmd[1:]], check=True)


def model_demo(console: Console, args: argparse.Namespace) -> None:
    with llamaspec.Model(args.model) as model:
        console.print(f"[bold]{model.description}[/] ({model.n_params / 1e9:.2f}B params, "
                      f"{model.n_layer_nextn} MTP layer(s)), method {args.method}")
        question = args.chat or "Write a haiku about the sea."
        prompt = model.apply_chat_template([{"role": "user", "content": question}], enable_thinking=False,
                                           tokenize=True)
        console.print(f"[dim]user:[/] {question}\n")
        with llamaspec.Speculative(model, method=args.method, n_draft=args.n_draft, draft_model=args.draft_model,
                                   n_ctx=args.n_ctx, n_threads=args.threads) as spec:
            stream(console, ",".join(spec.methods), spec, prompt, args.tokens, True, temperature=args.temperature)
            console.print(spec.print_stats())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF with an MTP head (default: the generated speed fixtures)")
    ap.add_argument("--chat", help="a question for --model, rendered with its chat template")
    ap.add_argument("--method", nargs="+", default=["mtp"],
                    help="speculative method(s) for --model: mtp, draft, eagle3, dflash, dspark, ngram-mod, ... "
                         "(several: a chain)")
    ap.add_argument("--draft-model", help="the draft model / drafter head for --method draft, eagle3, dflash, dspark")
    ap.add_argument("--n-draft", type=n_draft_arg, default="auto",
                    help='draft length per verify, or "auto" (the default: chosen per verify)')
    ap.add_argument("--fixed", type=int, default=3,
                    help="also run MTP at this fixed draft length for comparison (0: do not)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per session on the fixtures (medians)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-bench", dest="bench", action="store_false",
                    help="on the fixtures, skip the closing llamaspec bench run")
    args = ap.parse_args()
    console = Console()
    if args.model:
        model_demo(console, args)
    else:
        fixture_demo(console, args)


if __name__ == "__main__":
    main()
