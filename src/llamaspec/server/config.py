"""`llamaspec serve` options: one argparse parser that accepts our spelling and llama-server's.

Each option is declared once here (its flags, its type, its default and its help); ``ServerConfig`` is
what the rest of the server reads.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from .._flags import (
    add_context_arguments,
    add_model_arguments,
    add_n_predict_argument,
    add_sampling_arguments,
    add_speculative_arguments,
    check_context_arguments,
    model_path,
    sampling_from_args,
)
from .._options import POOLING_TYPES
from ..chat import REASONING_FORMATS
from ..errors import InvalidOptionError
from ..grammar import json_schema_to_grammar


@dataclass(frozen=True)
class ServerConfig:
    """What `llamaspec serve` was started with (see ``add_serve_arguments`` for each field)."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    alias: str | None = None
    api_key: tuple[str, ...] = ()
    metrics: bool = False
    slots: bool = True
    webui: bool = True  # the chat page at / (webui.py)
    cors_origins: tuple[str, ...] = ()
    queue: int = 64
    n_seq: int = 4
    ctx_checkpoints: int = 8  # prompt-cache checkpoints per sequence (llama-server's --ctx-checkpoints)
    checkpoint_every: int = 8192  # and one inside a prompt every this many tokens (--checkpoint-min-step)
    cache_ram_mb: int = 8192  # host memory for saved prompts (llama-server's --cache-ram; -1: no limit)
    n_ctx: int = 0  # total over the sequences; 0: the model's training context (at most 16384)
    n_batch: int | None = None
    n_ubatch: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_predict: int = -1
    n_gpu_layers: int | None = None  # None: all layers with rpc_servers, else none (Model's default)
    rpc_servers: tuple[str, ...] = ()
    rpc_timeout: float = 120.0
    method: str | None = None  # None: "mtp" when the model has MTP layers, else plain
    draft_model: str | None = None
    n_draft: int | Literal["auto"] = "auto"
    n_draft_min: int = 0
    p_min: float = 0.0
    chat_template_file: str | None = None
    reasoning_format: str = "auto"  # a chat request's default (its reasoning_format field overrides it)
    pooling: str | None = None  # /v1/embeddings: None is the model's own pooling, else mean
    sampling: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False

    @property
    def model_id(self) -> str:
        """The name /v1/models reports: the alias, else the file name."""
        return self.alias or os.path.basename(self.model)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `llamaspec serve` (llama-server's spelling of the common ones is accepted)."""
    add_model_arguments(p, "to serve")
    net = p.add_argument_group("network")
    net.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    net.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    net.add_argument("-a", "--alias", help="the model name clients see (default: the file name)")
    net.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="require 'Authorization: Bearer KEY' (or X-Api-Key) on every route but /health and the chat "
        "page (which asks for it); may be repeated",
    )
    net.add_argument("--api-key-file", help="a file with one API key per line")
    net.add_argument("--metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    net.add_argument("--no-slots", dest="slots", action="store_false", help="disable /slots")
    net.add_argument("--slots", dest="slots", action="store_true", help="enable /slots (the default)")
    net.add_argument("--no-webui", dest="webui", action="store_false",
                     help="do not serve the chat page at / (served by default, public even with an API key)")
    net.add_argument(
        "--cors-origins",
        default="",
        help="comma-separated origins allowed by CORS (default without an API key: localhost only; "
        "with one: any origin, as llama-server)",
    )
    net.add_argument(
        "--queue",
        type=int,
        default=64,
        help="requests that may wait for a free sequence; beyond, 503 with Retry-After (default 64)",
    )
    eng = p.add_argument_group("engine")
    eng.add_argument(
        "-np",
        "--parallel",
        "--n-seq",
        dest="n_seq",
        type=int,
        default=4,
        help="sequences decoded together: requests served at once (default 4)",
    )
    eng.add_argument(
        "--ctx-checkpoints",
        "-ctxcp",
        dest="ctx_checkpoints",
        type=int,
        default=8,
        help="prompt-cache checkpoints per sequence on hybrid/recurrent models and for MTP/EAGLE-3 "
        "drafters (default 8; 0: none)",
    )
    eng.add_argument(
        "--checkpoint-every",
        "--checkpoint-min-step",
        "-cms",
        dest="checkpoint_every",
        type=int,
        default=8192,
        help="on those models, also a checkpoint inside a long prompt every N tokens (default 8192; 0: only "
        "at prompt ends)",
    )
    eng.add_argument(
        "--cache-ram",
        "-cram",
        dest="cache_ram_mb",
        type=int,
        default=8192,
        help="host memory in MiB for prompts saved from sequences reused for another prompt, loaded again "
        "when their prompt comes back (default 8192; 0: off; -1: no limit)",
    )
    add_context_arguments(
        eng,
        "total context, split evenly over the sequences (default 0: the model's training context, "
        "at most 16384)",
    )
    add_n_predict_argument(eng, -1, "default max tokens of a request (-1: until the context is full)")
    eng.add_argument("--chat-template-file", help="a Jinja chat template to use instead of the model's")
    eng.add_argument(
        "--reasoning-format",
        choices=REASONING_FORMATS,
        default="auto",
        help="where a thinking model's reasoning goes in chat replies: auto/deepseek put it in "
        "reasoning_content, none leaves it in the content (default auto; a request's reasoning_format "
        "overrides it)",
    )
    eng.add_argument(
        "--pooling",
        choices=tuple(POOLING_TYPES),
        help="how /v1/embeddings pools a text's tokens (default: the model's own pooling type, else mean)",
    )
    eng.add_argument(
        "--embeddings",
        "--embedding",
        action="store_true",
        help="accepted for llama-server scripts: /v1/embeddings is always served (its context is made "
        "on first use)",
    )
    eng.add_argument(
        "--jinja",
        action="store_true",
        help="accepted for llama-server scripts: templates always run on llama.cpp's jinja engine",
    )
    eng.add_argument(
        "-bs",
        "--backend-sampling",
        "--backend_sampling",
        action="store_true",
        help="accepted for llama-server scripts: llamaspec always samples on the host, after each pass",
    )
    add_speculative_arguments(p)
    add_sampling_arguments(p, "sampling defaults (a request's fields override them)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")


def config_from_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> ServerConfig:
    """Check the parsed options together; a problem is a usage error (p.error exits with 2)."""
    keys = [k for k in a.api_key if k]
    if a.api_key_file:
        try:
            with open(a.api_key_file, encoding="utf-8") as f:
                keys += [line.strip() for line in f if line.strip()]
        except OSError as e:
            p.error(f"cannot read --api-key-file: {e}")
    if not 0 <= a.ctx_checkpoints <= 1024:
        p.error(f"--ctx-checkpoints must be in [0, 1024], got {a.ctx_checkpoints}")
    if not 0 <= a.checkpoint_every <= 1 << 30:
        p.error(f"--checkpoint-every must be in [0, 2**30], got {a.checkpoint_every}")
    if not -1 <= a.cache_ram_mb <= 1 << 30:
        p.error(f"--cache-ram must be in [-1, 2**30], got {a.cache_ram_mb}")
    if a.n_seq < 1 or a.n_seq > 64:
        p.error(f"-np/--n-seq must be in [1, 64], got {a.n_seq}")
    check_context_arguments(p, a)
    if a.queue < 0:
        p.error(f"--queue must be >= 0, got {a.queue}")
    try:
        sampling = sampling_from_args(a)  # llama-server's seed -1: a random seed per request
        if "json_schema" in sampling:  # converted once: requests without their own use the grammar
            sampling["grammar"] = json_schema_to_grammar(sampling.pop("json_schema"))
    except (InvalidOptionError, OSError, UnicodeError) as e:
        p.error(str(e))
    model = model_path(p, a)  # last: -hf may download
    return ServerConfig(
        model=model,
        host=a.host,
        port=a.port,
        alias=a.alias,
        api_key=tuple(keys),
        metrics=a.metrics,
        slots=a.slots,
        webui=a.webui,
        cors_origins=tuple(o.strip() for o in a.cors_origins.split(",") if o.strip()),
        queue=a.queue,
        n_seq=a.n_seq,
        ctx_checkpoints=a.ctx_checkpoints,
        checkpoint_every=a.checkpoint_every,
        cache_ram_mb=a.cache_ram_mb,
        n_ctx=a.n_ctx,
        n_batch=a.n_batch,
        n_ubatch=a.n_ubatch,
        n_threads=a.n_threads,
        n_threads_batch=a.n_threads_batch,
        n_predict=a.n_predict,
        n_gpu_layers=a.n_gpu_layers,
        rpc_servers=tuple(a.rpc_servers or ()),
        rpc_timeout=a.rpc_timeout,
        method=a.method,
        draft_model=a.draft_model,
        n_draft=a.n_draft,
        n_draft_min=a.n_draft_min,
        p_min=a.p_min,
        chat_template_file=a.chat_template_file,
        reasoning_format=a.reasoning_format,
        pooling=a.pooling,
        sampling=sampling,
        verbose=a.verbose,
    )
