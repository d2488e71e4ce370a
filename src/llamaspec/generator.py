"""Generator: plain (non-speculative) streaming generation, on the same engine as Speculative."""

from __future__ import annotations

from typing import Any

from . import _native
from ._log import sync_log_level
from ._options import int_option, prompt_cache_config, session_context_options
from ._session import _StreamingSession
from .model import Model

__all__ = ["Generator"]


class Generator(_StreamingSession):
    """Plain streaming generation: the session engine with no drafter.

    Up to ``n_seq`` calls run at once (from different threads or asyncio tasks, or
    ``generate_batch``), each on its own sequence of ``n_ctx`` tokens, all of them decoded together
    in one target pass per step; each call's output is what it gives alone (greedy, or seeded). One
    more call raises BusyError. Each call starts from an empty cache.

    Example:
        >>> with llamaspec.Model(path) as model, llamaspec.Generator(model, n_ctx=4096) as gen:
        ...     for piece in gen.stream("Once upon a time", max_tokens=64, temperature=0):
        ...         print(piece, end="", flush=True)
    """

    def __init__(self, model: Model, *, n_seq: int = 1, ctx_checkpoints: int = 8,
                 checkpoint_every: int = 8192, prompt_cache_mb: int = 0, **options: Any) -> None:
        """Create the generator, its context and its engine.

        Args:
            model: the loaded model (shared, not owned).
            n_seq: calls that may run at once (1..64), each with n_ctx tokens of its own.
            ctx_checkpoints: prompt-cache checkpoints kept per sequence, in [0, 1024] (README,
                "Prompt cache"); they are taken on models whose state cannot be cut back (hybrid
                and recurrent models) and for drafters that carry a hidden row (MTP, EAGLE-3).
                0: none (a prompt that diverges inside what such a sequence holds is decoded anew).
            checkpoint_every: on those models, also a checkpoint inside a long prompt every this many
                tokens (at the end of a prompt chunk), in [0, 2**30]; 0: only at prompt ends.
            prompt_cache_mb: host memory (MiB) for prompts saved from sequences that a call reuses
                for another prompt, loaded again when a prompt that shares their start comes back
                (llama-server's --cache-ram); least recently saved go first. 0: off; -1: no limit.
            **options: context options (see Context): n_ctx (2048), n_threads, n_batch, ...;
                n_seq_max and kv_unified are the session's own (set by n_seq).

        Raises:
            TypeError: an unknown option.
            InvalidOptionError: an invalid option value.
            LlamaspecError: llama.cpp could not create the context.
        """
        n_seq = int_option("n_seq", n_seq, 1, 64)
        cache = prompt_cache_config(ctx_checkpoints, checkpoint_every, prompt_cache_mb)
        opts = session_context_options(options)
        native_model = model._require()
        sync_log_level()
        native = _native.Session.create(native_model, opts, {"methods": [], "n_seq": n_seq, **cache}, None)
        self._init_session(model, native, opts, n_seq)

    def __repr__(self) -> str:
        n_ctx = self._context.n_ctx if not self._closed else "?"
        return f"<llamaspec.Generator n_ctx={n_ctx} n_seq={self._n_seq} model={self._model!r}>"
