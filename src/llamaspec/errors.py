"""The exceptions llamaspec raises: one base class, one subclass per kind of failure.

Every class takes the message and, where known, ``code`` (llama.cpp's return code, e.g. from
``llama_decode``) and ``path`` (the file involved). The native core raises these same classes.
"""

from __future__ import annotations

__all__ = [
    "LlamaspecError",
    "ModelLoadError",
    "UnsupportedModelError",
    "ContextOverflowError",
    "BusyError",
    "GenerationTimeout",
    "InvalidOptionError",
    "GrammarError",
    "ChatTemplateError",
    "DecodeError",
    "ClosedError",
    "IncompatibleVocabError",
    "DraftModelRequiredError",
    "LoadCancelledError",
    "BackendError",
]


class LlamaspecError(Exception):
    """Base class of every llamaspec error.

    Attributes:
        code: llama.cpp's return code when the failure came from a llama.cpp call that returns one,
            else None.
        path: the file involved (a model path), else None.
    """

    def __init__(self, message: str, *, code: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.path = path


class ModelLoadError(LlamaspecError):
    """A model file could not be loaded: missing, a directory, not GGUF, truncated or corrupt."""


class LoadCancelledError(ModelLoadError):
    """Loading was stopped by the ``progress`` callable of ``Model`` (it returned False)."""


class UnsupportedModelError(LlamaspecError):
    """The file is a valid GGUF, but llama.cpp (or the requested feature) does not support this model."""


class ContextOverflowError(LlamaspecError):
    """The prompt plus ``max_tokens`` does not fit in the context (``n_ctx``); raised before decoding."""


class BusyError(LlamaspecError):
    """A generation is already running on this object; it runs one generation at a time."""


class GenerationTimeout(LlamaspecError, TimeoutError):
    """No piece arrived within the timeout; the native generation has been stopped."""


class InvalidOptionError(LlamaspecError, ValueError):
    """An option or argument has an invalid value (checked before anything native runs)."""


class GrammarError(InvalidOptionError):
    """The GBNF grammar could not be parsed; the message carries llama.cpp's parser error."""


class ChatTemplateError(LlamaspecError):
    """The chat template could not be rendered for these messages."""


class DecodeError(LlamaspecError):
    """``llama_decode`` failed; ``code`` is its return code."""


class ClosedError(LlamaspecError):
    """The object was closed and cannot be used any more."""


class IncompatibleVocabError(UnsupportedModelError):
    """A draft model's vocabulary does not match the target's (type, BOS/EOS, size or token texts),
    so its tokens cannot be verified by the target; ``path`` is the draft model's file."""


class DraftModelRequiredError(InvalidOptionError):
    """The speculative method drafts with a separate model (draft-simple, EAGLE-3, DFlash, DSpark)
    and no ``draft_model`` was given."""


class BackendError(LlamaspecError):
    """A compute backend of the model failed: an RPC worker stopped, went silent past ``rpc_timeout``
    or answered wrongly. The call in progress ends with it, and so does every later call on that
    ``Model`` (its weights there are lost); load the model again once the worker is back."""
