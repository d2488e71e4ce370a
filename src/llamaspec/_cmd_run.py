"""`llamaspec run MODEL -p TEXT`: one answer streamed to the terminal with a live status line (tokens
per second, acceptance, the draft length in use), or one JSON object with ``--json``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from ._flags import (
    add_context_arguments,
    add_model_arguments,
    add_n_predict_argument,
    add_sampling_arguments,
    add_speculative_arguments,
    check_context_arguments,
    model_options,
    model_path,
    sampling_from_args,
    session_from_args,
)
from ._terminal import LoadBar, StatusLine, is_terminal
from .errors import ContextOverflowError
from .events import Done, GenerationStats, Stats, Token
from .generator import Generator
from .model import Model
from .speculative import Speculative
from .stats import SpecStats

STATS_EVERY = 4  # tokens between two status-line updates


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `llamaspec run`."""
    add_model_arguments(p, "to run")
    src = p.add_argument_group("prompt")
    src.add_argument("-p", "--prompt", help="the prompt text")
    src.add_argument("-f", "--file", help="read the prompt from this file ('-': standard input)")
    src.add_argument("--system", help="a system message (with the chat template)")
    src.add_argument(
        "--raw",
        action="store_true",
        help="send the prompt as it is, without the model's chat template (the default when the model "
        "has no template)",
    )
    out = p.add_argument_group("output")
    add_n_predict_argument(
        out, -1, "tokens to generate at most (default -1: until the model stops or the context is full)"
    )
    out.add_argument("--json", action="store_true", help="print one JSON object with the text and statistics")
    eng = p.add_argument_group("engine")
    add_context_arguments(eng, "context size (default 0: the model's training context, at most 16384)")
    add_speculative_arguments(p)
    add_sampling_arguments(p, "sampling (default: the library's: temperature 0.8, top-k 40, top-p 0.95, ...)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


def read_prompt(p: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    """The prompt text from -p, -f or a piped standard input; none or both is a usage error."""
    if a.prompt is not None and a.file is not None:
        p.error("give the prompt once: -p or -f, not both")
    required = "a prompt is required: -p TEXT, -f FILE or text on standard input"
    if a.prompt is not None:
        text: str = a.prompt
    elif a.file == "-" or (a.file is None and not sys.stdin.isatty()):
        text = sys.stdin.read()
        if a.file is None and not text:
            p.error(required)  # nothing piped in (e.g. stdin is /dev/null)
    elif a.file is not None:
        with open(a.file, encoding="utf-8") as f:  # OSError: a runtime error (exit 1), as a missing model
            text = f.read()
    else:
        p.error(required)
    if not text.strip():
        p.error("the prompt is empty")
    return text


def prompt_ids(model: Model, text: str, a: argparse.Namespace) -> list[int]:
    """The prompt's tokens: the chat template's (the safe messages path) unless --raw or the model has
    none, then the text as is."""
    if a.raw or model.chat_template is None:
        return model.tokenize(text, add_special=True, parse_special=False)
    messages = ([{"role": "system", "content": a.system}] if a.system else []) + [
        {"role": "user", "content": text}
    ]
    return model.apply_chat_template(messages, tokenize=True)


def n_ctx_for(model: Model, n_ctx: int) -> int:
    """-c, or the model's training context capped at 16384 (as serve)."""
    return n_ctx or min(model.n_ctx_train or 4096, 16384)


class Status:
    """The status line's text from a session's statistics snapshots."""

    def __init__(self, method: str, session: Generator | Speculative) -> None:
        self.method = method
        self.auto = isinstance(session, Speculative) and session.adaptive
        self.t_first = 0.0
        self.tokens = 0
        self._hist: tuple[int, ...] = ()
        self.length = 0.0
        self.acceptance = 0.0

    def token(self) -> None:
        self.tokens += 1
        if self.tokens == 1:
            self.t_first = time.perf_counter()

    def snapshot(self, st: SpecStats) -> None:
        """Take the draft length in use since the previous snapshot from the histogram's growth."""
        h = st.draft_length_histogram
        d = [n - (self._hist[i] if i < len(self._hist) else 0) for i, n in enumerate(h)]
        if sum(d) > 0:
            self.length = sum(i * n for i, n in enumerate(d)) / sum(d)
        self._hist = h
        self.acceptance = st.acceptance_rate

    def text(self) -> str:
        dt = time.perf_counter() - self.t_first
        rate = (self.tokens - 1) / dt if self.tokens > 1 and dt > 0 else 0.0
        out = f" {self.tokens} tokens | {rate:.1f} tok/s"
        if self.method == "none":
            return out + " | plain decoding "
        how = "auto" if self.auto else "fixed"
        return out + (
            f" | {self.method} acceptance {self.acceptance:.0%}"
            f" | draft length {self.length:.1f} ({how}) "
        )


def summary(method: str, session: Generator | Speculative, st: GenerationStats) -> str:
    """The one line printed to stderr after the answer."""
    prompt = st.prompt_tokens - st.cached_tokens
    line = (
        f"{st.tokens} tokens in {st.generation_time:.2f} s ({st.tokens_per_second:.1f} tok/s); "
        f"prompt {prompt} tokens in {st.prefill_time:.2f} s"
    )
    if method == "none":
        return line + "; plain decoding"
    acc = st.drafts_accepted / st.drafts_generated if st.drafts_generated else 0.0
    tail = f"; {method}: acceptance {acc:.0%} ({st.drafts_accepted}/{st.drafts_generated})"
    if isinstance(session, Speculative):
        tail += f", mean draft length {session.stats().mean_draft_length:.2f}"
        tail += " (auto)" if session.adaptive else f" (fixed {session.n_draft})"
    return line + tail


def report(model: Model, method: str, session: Generator | Speculative, text: str,
           st: GenerationStats | None, interrupted: bool) -> dict[str, Any]:
    """What --json prints."""
    out: dict[str, Any] = {
        "model": model.path,
        "method": method,
        "n_draft": session.n_draft if isinstance(session, Speculative) else 0,
        "text": text,
        "interrupted": interrupted,
        "stats": dataclasses.asdict(st) if st is not None else None,
    }
    if isinstance(session, Speculative):
        s = session.stats()
        out["speculative"] = {
            "acceptance_rate": s.acceptance_rate,
            "drafts_generated": s.drafts_generated,
            "drafts_accepted": s.drafts_accepted,
            "mean_draft_length": s.mean_draft_length,
            "draft_length_histogram": list(s.draft_length_histogram),
        }
    return out


def run(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """`llamaspec run`; returns the exit code (130 after Ctrl-C)."""
    if a.n_predict == 0 or a.n_predict < -1:
        p.error(f"-n/--n-predict must be >= 1 or -1, got {a.n_predict}")
    check_context_arguments(p, a)
    text = read_prompt(p, a)
    sampling = sampling_from_args(a)
    path = model_path(p, a)  # last: -hf may download
    with Model(path, progress=LoadBar(path), **model_options(a)) as model:
        n_ctx = n_ctx_for(model, a.n_ctx)
        ids = prompt_ids(model, text, a)
        room = n_ctx - len(ids)
        if room < 1:
            raise ContextOverflowError(f"the prompt has {len(ids)} tokens, the context {n_ctx} (-c)")
        max_tokens = room if a.n_predict < 0 else min(a.n_predict, room)  # stops when the context is full
        session, method = session_from_args(model, a, n_ctx)
        with session:
            return _stream(a, model, method, session, ids, max_tokens, sampling)


def stream_answer(session: Generator | Speculative, method: str, ids: list[int], max_tokens: int,
                  sampling: dict[str, Any], live: bool) -> tuple[str, GenerationStats | None, bool]:
    """Generate and, with ``live``, stream the text to stdout with the status line; returns (text,
    the call's stats or None when interrupted before the end, whether Ctrl-C interrupted it)."""
    pieces: list[str] = []
    done: GenerationStats | None = None
    interrupted = False
    status = Status(method, session)
    line = StatusLine() if live else None
    events = session.stream_events(ids, max_tokens, None, emit_stats_every=STATS_EVERY, **sampling)
    try:
        if line is not None:
            line.open()
        for ev in events:
            if isinstance(ev, Token):
                pieces.append(ev.text)
                status.token()
                if line is not None:
                    line.write(ev.text)
            elif isinstance(ev, Stats):
                status.snapshot(ev.snapshot)
                if line is not None:
                    line.update(status.text())
            elif isinstance(ev, Done):
                done = ev.stats
    except KeyboardInterrupt:
        interrupted = True  # leaving the loop stops the native work (the generator is closed below)
    finally:
        try:
            events.close()  # type: ignore[attr-defined]
        finally:  # the terminal is given back even if a second Ctrl-C lands in the close
            if line is not None:
                line.close()
    return "".join(pieces), done, interrupted


def _stream(a: argparse.Namespace, model: Model, method: str, session: Generator | Speculative,
            ids: list[int], max_tokens: int, sampling: dict[str, Any]) -> int:
    text, done, interrupted = stream_answer(session, method, ids, max_tokens, sampling, live=not a.json)
    if a.json:
        json.dump(report(model, method, session, text, done, interrupted), sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        if is_terminal(sys.stdout) and not text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if done is not None:
            print(summary(method, session, done), file=sys.stderr)
        if interrupted:
            print("interrupted", file=sys.stderr)
    return 130 if interrupted else 0
