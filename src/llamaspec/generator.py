"""Generator: plain (non-speculative) streaming generation."""

from __future__ import annotations

from typing import Any

from . import _native
from ._log import sync_log_level
from ._options import context_options
from ._session import _StreamingSession
from .context import Context
from .model import Model

__all__ = ["Generator"]


class Generator(_StreamingSession):
    """Plain streaming generation on its own context.

    One generation runs at a time per Generator (a concurrent call raises BusyError); use one
    Generator per thread for parallel generation (they may share one Model). Each call starts from an
    empty KV cache.

    Example:
        >>> with llamaspec.Model(path) as model, llamaspec.Generator(model, n_ctx=4096) as gen:
        ...     for piece in gen.stream("Once upon a time", max_tokens=64, temperature=0):
        ...         print(piece, end="", flush=True)
    """

    def __init__(self, model: Model, **options: Any) -> None:
        """Create the generator and its context.

        Args:
            model: the loaded model (shared, not owned).
            **options: context options (see Context): n_ctx (2048), n_threads, n_batch, ...

        Raises:
            TypeError: an unknown option.
            InvalidOptionError: an invalid option value.
            LlamaspecError: llama.cpp could not create the context.
        """
        self._init_session()
        self._model = model
        opts = context_options(options)
        sync_log_level()
        self._context = Context._from_native(model, _native.Context.create(model._require(), opts), opts)
        self._engine = _native.Generator(self._context._require())

    def __repr__(self) -> str:
        return f"<llamaspec.Generator n_ctx={self._context.n_ctx if not self._closed else '?'} model={self._model!r}>"
