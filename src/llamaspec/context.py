"""Context: the low-level llama.cpp context (KV cache + compute state) on a Model."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _native
from ._log import sync_log_level
from ._options import context_options
from .errors import ClosedError, InvalidOptionError
from .model import Model

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Context"]


class Context:
    """A llama.cpp context on a shared Model: the low-level object.

    Generator and later sessions create and own theirs from the same keyword options. A Context keeps
    its Model's weights alive. It is not thread-safe: decode from one thread at a time.

    Options (all keyword, all optional; llama.cpp's defaults unless noted):
        n_ctx (2048; 0 = the model's training context), n_threads (physical cores),
        n_threads_batch (= n_threads), n_batch, n_ubatch, n_seq_max, type_k / type_v (cache types
        by name: "f16", "q8_0", ...), flash_attn ("auto" | "on" | "off"), offload_kqv, op_offload,
        rope_scaling_type ("none" | "linear" | "yarn" | "longrope"), rope_freq_base,
        rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow,
        yarn_orig_ctx, attention_type ("causal" | "non_causal"), no_perf, swa_full, kv_unified.
    """

    def __init__(self, model: Model, **options: Any) -> None:
        """Create a context (releases the GIL while llama.cpp allocates it).

        Raises:
            TypeError: an unknown option.
            InvalidOptionError: an invalid option value.
            LlamaspecError: llama.cpp could not create the context.
        """
        opts = context_options(options)
        sync_log_level()
        self._init(model, _native.Context.create(model._require(), opts), opts)

    def _init(self, model: Model, native: _native.Context, options: dict[str, Any]) -> None:
        self._model = model
        self._native: _native.Context | None = native
        self._options = options

    @classmethod
    def _from_native(cls, model: Model, native: _native.Context, options: dict[str, Any]) -> Context:
        self = cls.__new__(cls)
        self._init(model, native, options)
        return self

    def _require(self) -> _native.Context:
        if self._native is None:
            raise ClosedError("the context is closed")
        return self._native

    @property
    def model(self) -> Model:
        """The model of this context."""
        return self._model

    @property
    def options(self) -> dict[str, Any]:
        """The validated options this context was created with."""
        return dict(self._options)

    @property
    def n_ctx(self) -> int:
        """Context size in tokens."""
        return self._require().n_ctx

    @property
    def n_batch(self) -> int:
        """Logical batch size (tokens per llama_decode call)."""
        return self._require().n_batch

    @property
    def n_ubatch(self) -> int:
        """Physical batch size."""
        return self._require().n_ubatch

    @property
    def n_seq_max(self) -> int:
        """Maximum number of sequences."""
        return self._require().n_seq_max

    @property
    def n_threads(self) -> int:
        """Threads used for single-token decoding."""
        return self._require().n_threads

    @property
    def n_threads_batch(self) -> int:
        """Threads used for batch (prompt) decoding."""
        return self._require().n_threads_batch

    def clear(self) -> None:
        """Empty the KV cache and recurrent state."""
        self._require().clear()

    def decode(self, tokens: Sequence[int], pos0: int = 0) -> None:
        """Decode tokens of sequence 0 at positions pos0.. (releases the GIL); logits for the last.

        Raises:
            InvalidOptionError: a token id is out of range.
            DecodeError: llama_decode failed (``code`` holds its return code).
        """
        if isinstance(pos0, bool) or not isinstance(pos0, int) or pos0 < 0:
            raise InvalidOptionError("pos0 must be an int >= 0")
        ids = list(tokens)
        if not ids:
            raise InvalidOptionError("nothing to decode")
        self._require().decode(ids, pos0)

    def logits(self) -> np.ndarray:
        """The logits of the last decoded token (a new float32 numpy array of n_vocab)."""
        return self._require().logits()

    def perf(self) -> dict[str, float]:
        """llama.cpp's own counters for this context: load_ms, prompt_eval_ms, eval_ms,
        prompt_tokens, eval_runs, graphs_reused. All zero unless created with ``no_perf=False``."""
        return {k: float(v) for k, v in self._require().perf().items()}

    def perf_reset(self) -> None:
        """Reset llama.cpp's performance counters."""
        self._require().perf_reset()

    def close(self) -> None:
        """Free the context (once no running generation uses it). Idempotent."""
        self._native = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
