"""`llamaspec serve` options: one argparse parser that accepts our spelling and llama-server's.

Each option is declared once here (its flags, its type, its default and its help); ``ServerConfig`` is
what the rest of the server reads.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from .._options import normalize_methods
from ..errors import InvalidOptionError
from ..speculative import METHODS


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
    n_gpu_layers: int = 0
    method: str | None = None  # None: "mtp" when the model has MTP layers, else plain
    draft_model: str | None = None
    n_draft: int | Literal["auto"] = "auto"
    n_draft_min: int = 0
    p_min: float = 0.0
    chat_template_file: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False

    @property
    def model_id(self) -> str:
        """The name /v1/models reports: the alias, else the file name."""
        return self.alias or os.path.basename(self.model)


def _n_draft(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0 or 'auto', got {v!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0 or 'auto', got {v!r}")
    return n


def _method(v: str) -> str:
    """'none', a method name or a comma-separated chain of them (llama-server's --spec-type)."""
    if v in ("none", "plain"):
        return "none"
    try:
        return ",".join(normalize_methods([n.strip() for n in v.split(",")]))
    except InvalidOptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `llamaspec serve` (llama-server's spelling of the common ones is accepted)."""
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help="the GGUF file to serve")
    p.add_argument(
        "-m", "--model", dest="model_opt", metavar="PATH", help="the GGUF file (llama-server's flag)"
    )
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
        help="require 'Authorization: Bearer KEY' (or X-Api-Key) on every route but /health; may be repeated",
    )
    net.add_argument("--api-key-file", help="a file with one API key per line")
    net.add_argument("--metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    net.add_argument("--no-slots", dest="slots", action="store_false", help="disable /slots")
    net.add_argument("--slots", dest="slots", action="store_true", help="enable /slots (the default)")
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
    eng.add_argument(
        "-c",
        "--ctx-size",
        dest="n_ctx",
        type=int,
        default=0,
        help="total context, split evenly over the sequences (default 0: the model's "
        "training context, at most 16384)",
    )
    eng.add_argument("-b", "--batch-size", dest="n_batch", type=int, help="logical batch size")
    eng.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, help="physical batch size")
    eng.add_argument("-t", "--threads", dest="n_threads", type=int, help="threads for generation")
    eng.add_argument("-tb", "--threads-batch", dest="n_threads_batch", type=int, help="threads for prompts")
    eng.add_argument(
        "-n",
        "--n-predict",
        "--predict",
        dest="n_predict",
        type=int,
        default=-1,
        help="default max tokens of a request (-1: until the context is full)",
    )
    eng.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="n_gpu_layers",
        type=int,
        default=0,
        help="layers to offload to a GPU (a GPU build only)",
    )
    eng.add_argument("--chat-template-file", help="a Jinja chat template to use instead of the model's")
    eng.add_argument(
        "--jinja",
        action="store_true",
        help="accepted for llama-server scripts: templates always run on llama.cpp's jinja engine",
    )
    spec = p.add_argument_group("speculative decoding")
    spec.add_argument(
        "--method",
        "--spec-type",
        dest="method",
        type=_method,
        help="drafter: none, " + ", ".join(METHODS) + " (default: mtp when the model has MTP "
        "layers, draft with --draft-model, else none)",
    )
    spec.add_argument(
        "-md",
        "--draft-model",
        "--model-draft",
        "--spec-draft-model",
        dest="draft_model",
        help="a draft model GGUF",
    )
    spec.add_argument(
        "--n-draft",
        "--draft-max",
        "--draft",
        "--draft-n",
        "--spec-draft-n-max",
        dest="n_draft",
        type=_n_draft,
        default="auto",
        help="draft length per verify: 'auto' (the default: chosen per verify from measured acceptance and "
        "costs, plain decoding when drafting does not pay) or a fixed longest draft",
    )
    spec.add_argument(
        "--draft-min",
        "--draft-n-min",
        "--spec-draft-n-min",
        dest="n_draft_min",
        type=int,
        default=0,
        help="drafts shorter than this are dropped (default 0)",
    )
    spec.add_argument(
        "--draft-p-min",
        "--spec-draft-p-min",
        dest="p_min",
        type=float,
        default=0.0,
        help="draft models stop at a token less likely than this (default 0)",
    )
    samp = p.add_argument_group("sampling defaults (a request's fields override them)")
    samp.add_argument("--temp", "--temperature", dest="temperature", type=float)
    samp.add_argument("--top-k", dest="top_k", type=int)
    samp.add_argument("--top-p", dest="top_p", type=float)
    samp.add_argument("--min-p", dest="min_p", type=float)
    samp.add_argument("-s", "--seed", dest="seed", type=int)
    samp.add_argument("--repeat-penalty", dest="repeat_penalty", type=float)
    samp.add_argument("--repeat-last-n", dest="penalty_last_n", type=int)
    samp.add_argument("--presence-penalty", dest="presence_penalty", type=float)
    samp.add_argument("--frequency-penalty", dest="frequency_penalty", type=float)
    p.add_argument("-v", "--verbose", action="store_true", help="log every request")


_SAMPLING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "repeat_penalty",
    "penalty_last_n",
    "presence_penalty",
    "frequency_penalty",
)


def config_from_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> ServerConfig:
    """Check the parsed options together; a problem is a usage error (p.error exits with 2)."""
    model = a.model_opt or a.model_pos
    if not model:
        p.error("a model is required: llamaspec serve MODEL.gguf (or -m MODEL.gguf)")
    if a.model_opt and a.model_pos:
        p.error("give the model once: positional or -m, not both")
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
    if a.n_ctx < 0:
        p.error(f"-c/--ctx-size must be >= 0, got {a.n_ctx}")
    if a.queue < 0:
        p.error(f"--queue must be >= 0, got {a.queue}")
    seed = a.seed
    sampling = {k: getattr(a, k) for k in _SAMPLING_FLAGS if getattr(a, k) is not None}
    if seed is not None and seed < 0:
        sampling.pop("seed")  # llama-server's -1: a random seed per request
    return ServerConfig(
        model=model,
        host=a.host,
        port=a.port,
        alias=a.alias,
        api_key=tuple(keys),
        metrics=a.metrics,
        slots=a.slots,
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
        method=a.method,
        draft_model=a.draft_model,
        n_draft=a.n_draft,
        n_draft_min=a.n_draft_min,
        p_min=a.p_min,
        chat_template_file=a.chat_template_file,
        sampling=sampling,
        verbose=a.verbose,
    )
