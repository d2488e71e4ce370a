"""llama.cpp's RPC worker: serve this machine's compute to a ``Model(..., rpc_servers=[...])`` elsewhere.

The worker is ggml's own RPC server (the one upstream's ``rpc-server`` runs), started from
llamaspec's extension, so a worker and its clients always speak the same protocol version. The
protocol has no authentication or encryption: whoever reaches the port can run computations on
the worker and read what it holds. Bind it to 127.0.0.1 (the default) or a network you trust.
"""

from __future__ import annotations

import os
import socket

from . import _native
from .errors import InvalidOptionError, LlamaspecError

__all__ = ["DEFAULT_PORT", "serve"]

DEFAULT_PORT = 50052  # upstream rpc-server's


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    threads: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Serve this machine's devices (its GPUs, else its CPU) to RPC clients; never returns normally.

    Clients are served one at a time, each until it disconnects (ggml's server loop, which has no
    stop: end the process to stop it). The GIL is released while it runs.

    Args:
        host: the IPv4 address (or a host name, resolved here) to bind to; 127.0.0.1 keeps the
            worker private to this machine.
        port: the TCP port.
        threads: CPU threads for the computations (default: half the cores, as upstream).
        cache_dir: where to keep tensors a client sent, so that the next load sends only their
            hashes (upstream's ``--cache``); None: no cache.

    Raises:
        InvalidOptionError: a bad or unresolvable host, port or thread count.
        LlamaspecError: the socket could not be made (the address is in use, say); ggml printed why.
    """
    if not isinstance(host, str) or not host or any(c in host for c in " /:"):
        raise InvalidOptionError(f"host must be a host name or IPv4 address, not {host!r}")
    try:
        address = socket.gethostbyname(host)  # ggml binds an IPv4 address only
    except OSError as e:
        raise InvalidOptionError(f"host {host!r} does not resolve to an IPv4 address ({e})") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidOptionError(f"port must be an int in 1-65535, not {port!r}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 2) // 2)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidOptionError(f"threads must be an int >= 1, not {threads!r}")
    cache = os.fspath(cache_dir) if cache_dir is not None else ""
    if cache:
        os.makedirs(cache, exist_ok=True)
    _native.rpc_serve(f"{address}:{port}", threads, cache)
    raise LlamaspecError(f"the RPC worker could not serve at {address}:{port} (is the port in use?)")
