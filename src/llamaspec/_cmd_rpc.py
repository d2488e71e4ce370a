"""``llamaspec rpc-server``: a llama.cpp RPC worker (see llamaspec.rpc)."""

from __future__ import annotations

import argparse
import os
import sys
import threading

from .rpc import DEFAULT_PORT, serve

WARNING = (
    "The RPC protocol has no authentication or encryption: anyone who reaches the port can run "
    "computations here and read what the worker holds. Keep it on 127.0.0.1 or a network you trust."
)


def add_rpc_server_arguments(p: argparse.ArgumentParser) -> None:
    """--host, --port, --threads, --cache."""
    p.add_argument("-H", "--host", default="127.0.0.1", help="address to bind to (default: 127.0.0.1)")
    p.add_argument("-p", "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default: {DEFAULT_PORT})")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: half the cores)")
    p.add_argument(
        "-c",
        "--cache",
        dest="cache_dir",
        metavar="DIR",
        help="keep the tensors clients send in DIR, so that a later load sends only their hashes",
    )


def rpc_server(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl-C, SIGTERM): ggml's loop has no stop, so it runs on a thread
    of its own and the process ends around it."""
    if not 1 <= a.port <= 65535:
        p.error(f"--port must be in 1-65535, got {a.port}")
    if a.threads is not None and a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    if not a.host.startswith("127.") and a.host != "localhost":
        print(f"llamaspec rpc-server: warning: binding to {a.host}. {WARNING}", file=sys.stderr)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            serve(a.host, a.port, threads=a.threads, cache_dir=a.cache_dir)
        except BaseException as e:  # reported by the main thread
            failed.append(e)

    worker = threading.Thread(target=run, name="llamaspec-rpc-server", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    except KeyboardInterrupt:
        print("llamaspec rpc-server: interrupted", file=sys.stderr)
        sys.stdout.flush()
        # the native loop cannot be stopped; leave without unwinding around it
        os._exit(130)
    if failed:
        raise failed[0]
    return 0
