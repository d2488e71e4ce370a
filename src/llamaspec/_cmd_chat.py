"""`llamaspec chat MODEL`: a multi-turn chat in the terminal with the model's template.

Each turn renders the whole conversation through the safe messages path (message text never
becomes control tokens, ADR 0015) and generates the answer; the session's prompt cache reuses what
the previous turns decoded, so a turn decodes only its new message. ``/reset`` forgets the
conversation (the system message stays), ``/stats`` prints the session's statistics, ``/exit`` (or
Ctrl-D) leaves; Ctrl-C stops the current answer and the chat goes on with what was said so far.
With standard input not a terminal, each line read is a user message (no prompt is printed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ._cmd_run import n_ctx_for, stream_answer
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
from ._terminal import LoadBar, is_terminal
from .errors import ChatTemplateError
from .generator import Generator
from .model import Model
from .speculative import Speculative

COMMANDS = "/reset forgets the conversation, /stats prints statistics, /exit leaves (or Ctrl-D)"


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `llamaspec chat`."""
    add_model_arguments(p, "to chat with")
    p.add_argument("--system", help="the system message")
    add_n_predict_argument(
        p, -1, "tokens per answer at most (default -1: until the model stops or the context is full)"
    )
    eng = p.add_argument_group("engine")
    add_context_arguments(
        eng, "context for the whole conversation (default 0: the model's training context, at most 16384)"
    )
    add_speculative_arguments(p)
    add_sampling_arguments(p, "sampling (default: the library's: temperature 0.8, top-k 40, top-p 0.95, ...)")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


class Chat:
    """One conversation on one session."""

    def __init__(self, a: argparse.Namespace, model: Model, method: str, session: Generator | Speculative,
                 n_ctx: int) -> None:
        self.a = a
        self.model = model
        self.method = method
        self.session = session
        self.n_ctx = n_ctx
        self.sampling = sampling_from_args(a)
        self.base: list[dict[str, str]] = [{"role": "system", "content": a.system}] if a.system else []
        self.history = list(self.base)
        self.used = 0  # tokens of the conversation so far (prompt + answer of the last turn)
        self.interactive = is_terminal(sys.stdin)

    def say(self, text: str) -> None:
        """A line of the chat's own (not the model's) on stderr."""
        print(text, file=sys.stderr, flush=True)

    def loop(self) -> int:
        if self.interactive:
            self.say(f"llamaspec chat: {self.model.path} ({self.method_label()}); {COMMANDS}; "
                     "Ctrl-C stops an answer")
            try:
                import readline  # noqa: F401  (line editing and history for input())
            except ImportError:  # pragma: no cover - not on every platform
                pass
        while True:
            try:
                line = input("> " if self.interactive else "")
            except EOFError:
                if self.interactive:
                    sys.stdout.write("\n")
                return 0
            except KeyboardInterrupt:
                sys.stdout.write("\n")
                self.say(f"({COMMANDS})")
                continue
            text = line.strip()
            if not text:
                continue
            if text in ("/exit", "/quit", "/bye"):
                return 0
            if text == "/reset":
                self.history, self.used = list(self.base), 0
                self.say("(the conversation is forgotten)")
            elif text == "/stats":
                self.say(self.stats_text())
            elif text.startswith("/"):
                self.say(f"unknown command {text.split()[0]}: {COMMANDS}")
            else:
                try:
                    self.turn(line.rstrip("\n"))
                except KeyboardInterrupt:  # outside the answer's loop (which stops by itself)
                    self.say("(stopped)")

    def method_label(self) -> str:
        if isinstance(self.session, Speculative):
            return f"{self.method}, draft length {self.session.n_draft}"
        return "plain decoding"

    def turn(self, message: str) -> None:
        """One user message and the answer to it."""
        self.history.append({"role": "user", "content": message})
        ids = self.model.apply_chat_template(self.history, tokenize=True)
        room = self.n_ctx - len(ids)
        if room < 1:
            self.history.pop()
            self.say(f"the conversation fills the context ({len(ids)} of {self.n_ctx} tokens, -c): /reset "
                     "to start again")
            return
        max_tokens = room if self.a.n_predict < 0 else min(self.a.n_predict, room)
        answer, done, interrupted = stream_answer(self.session, self.method, ids, max_tokens, self.sampling,
                                                  live=True)
        sys.stdout.write("\n")
        sys.stdout.flush()
        self.history.append({"role": "assistant", "content": answer})
        self.used = len(ids) + (done.tokens if done is not None else 0)
        if interrupted:
            self.say("(stopped)")

    def stats_text(self) -> str:
        """What /stats prints: the session's totals over the turns so far."""
        st = self.session.stats()
        turns = sum(1 for m in self.history if m["role"] == "user")
        out: dict[str, Any] = {
            "turns": turns,
            "context": f"{self.used} of {self.n_ctx} tokens",
            "generated": st.tokens_emitted,
            "tok/s": f"{st.tokens_per_second:.1f}",
            "prompt tokens reused": st.cached_tokens,
        }
        if isinstance(self.session, Speculative):
            out["drafter"] = self.method_label()
            out["acceptance"] = f"{st.acceptance_rate:.0%} ({st.drafts_accepted}/{st.drafts_generated})"
            out["mean draft length"] = f"{st.mean_draft_length:.2f}"
        return "\n".join(f"  {k}: {v}" for k, v in out.items())


def chat(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """`llamaspec chat`; returns the exit code."""
    if a.n_predict == 0 or a.n_predict < -1:
        p.error(f"-n/--n-predict must be >= 1 or -1, got {a.n_predict}")
    check_context_arguments(p, a)
    path = model_path(p, a)  # last: -hf may download
    with Model(path, progress=LoadBar(path), **model_options(a)) as model:
        if model.chat_template is None:
            raise ChatTemplateError(f"{path} has no chat template: use llamaspec run --raw")
        n_ctx = n_ctx_for(model, a.n_ctx)
        session, method = session_from_args(model, a, n_ctx)
        with session:
            return Chat(a, model, method, session, n_ctx).loop()
