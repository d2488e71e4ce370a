"""The `llamaspec` command (also `python -m llamaspec`). Subcommands: ``run`` (one answer, streamed),
``chat`` (a conversation), ``bench`` (plain vs speculative, as ratios), ``info`` (what a GGUF file
holds), ``serve`` (the OpenAI-compatible server), ``rpc-server`` (a llama.cpp RPC worker).

Exit codes: 0 ok, 1 a runtime error (one line, no traceback unless --verbose), 2 a usage error,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from ._cmd_bench import add_bench_arguments, bench
from ._cmd_chat import add_chat_arguments, chat
from ._cmd_info import add_info_arguments, info
from ._cmd_rpc import WARNING as RPC_WARNING
from ._cmd_rpc import add_rpc_server_arguments, rpc_server
from ._cmd_run import add_run_arguments, run
from ._terminal import is_terminal
from .errors import LlamaspecError

Command = Callable[[argparse.ArgumentParser, argparse.Namespace], int]


# name, its arguments, the command, a line for `llamaspec --help`, its own --help's description
SUBCOMMANDS: list[tuple[str, Callable[[argparse.ArgumentParser], None], Command, str, str]] = [
    ("run", add_run_arguments, run, "generate one answer, streamed, with live statistics",
     "Generate one answer to a prompt and stream it, with a status line (tokens/s, acceptance, draft "
     "length in use) on a terminal. The model's chat template is used when it has one (--raw: the text "
     "as it is)."),
    ("chat", add_chat_arguments, chat, "a conversation in the terminal",
     "Chat with a model through its chat template: each turn reuses what the earlier turns decoded. "
     "/reset forgets the conversation, /stats prints statistics, /exit or Ctrl-D leaves, Ctrl-C stops "
     "the current answer. Piped, each line of standard input is a message."),
    ("bench", add_bench_arguments, bench, "plain vs speculative decoding side by side, as ratios",
     "Measure plain decoding and speculative decoding at each --n-draft side by side in one run "
     "(sessions warmed up, the order rotating per round, medians of -r rounds): tokens/s, the ratio to "
     "plain decoding, acceptance, mean draft length, and whether the text equals plain decoding's."),
    ("info", add_info_arguments, info, "what a GGUF file holds and what this build runs it on",
     "Architecture, size, context, MTP layers, chat template, special tokens of a GGUF model, and this "
     "build's backends."),
    ("rpc-server", add_rpc_server_arguments, rpc_server,
     "a llama.cpp RPC worker for models split across machines",
     "Serve this machine's compute (its GPUs, else its CPU) to llamaspec or llama.cpp clients that load a "
     "model with --rpc HOST:PORT / rpc_servers=[...]; clients are served one at a time. " + RPC_WARNING),
]


def _guarded(name: str, cmd: Command, p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """Run a subcommand: a library error or an unreadable file is one line on stderr and exit 1 (the
    traceback too with --verbose); Ctrl-C outside a generation is exit 130."""
    try:
        return cmd(p, a)
    except (LlamaspecError, OSError, UnicodeError) as e:  # UnicodeError: a prompt file that is not UTF-8
        _clear_line()
        if getattr(a, "verbose", False):
            traceback.print_exc()
        message = " ".join(str(e).split()) or type(e).__name__
        print(f"llamaspec {name}: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _clear_line()
        print(f"llamaspec {name}: interrupted", file=sys.stderr)
        return 130


def _clear_line() -> None:
    """Clear a progress line (the load bar, bench's progress) that a failure cut short."""
    if is_terminal(sys.stderr):
        sys.stderr.write("\r\x1b[2K")


def _serve(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .server import config_from_args, create_app
    except ImportError as e:
        print(
            f"llamaspec serve needs the server extra: pip install 'llamaspec[server]' ({e})", file=sys.stderr
        )
        return 1
    cfg = config_from_args(p, a)
    logging.basicConfig(
        level=logging.INFO if cfg.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("llamaspec.server").setLevel(logging.INFO)
    if cfg.host not in ("127.0.0.1", "localhost", "::1") and not cfg.api_key:
        logging.getLogger("llamaspec.server").warning(
            "binding to %s without --api-key: anyone who reaches this address can use the model", cfg.host
        )
    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def load_failed(e: BaseException) -> None:
        failed.append(e)
        if server is not None:
            server.should_exit = True

    app = create_app(cfg, on_load_error=load_failed)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.host,
            port=cfg.port,
            # h11 even where httptools is installed: uvicorn's httptools protocol lowercases the
            # response's header names, and some clients read CORS headers case-sensitively (ADR 0028)
            http="h11",
            timeout_graceful_shutdown=3,
            log_level="info" if cfg.verbose else "warning",
            access_log=cfg.verbose,
        )
    )
    server.run()
    if failed:
        print(f"llamaspec serve: cannot load {cfg.model}: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="llamaspec", description="Run GGUF models on llama.cpp with speculative decoding."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, tuple[argparse.ArgumentParser, Command]] = {}
    for name, add_arguments, cmd, summary, description in SUBCOMMANDS:
        cp = sub.add_parser(name, help=summary, description=description)
        add_arguments(cp)
        commands[name] = (cp, cmd)
    sp = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server",
        description="Serve a GGUF model over an OpenAI-compatible HTTP API "
        "(/v1/chat/completions, /v1/completions, /completion, /metrics, ...).",
    )
    try:
        from .server.config import add_serve_arguments

        add_serve_arguments(sp)
        have_server = True
    except ImportError:
        have_server = False
    a = p.parse_args(argv)
    if a.command == "serve":
        if not have_server:
            print("llamaspec serve needs the server extra: pip install 'llamaspec[server]'", file=sys.stderr)
            return 1
        return _guarded("serve", _serve, sp, a)
    if a.command in commands:
        cp, cmd = commands[a.command]
        return _guarded(a.command, cmd, cp, a)
    p.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
