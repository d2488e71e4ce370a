"""The n-gram cache files of the ``ngram-cache`` speculative method."""

from __future__ import annotations

import os
from collections.abc import Sequence

from . import _native
from .errors import InvalidOptionError
from .model import Model

__all__ = ["ngram_cache_create"]


def ngram_cache_create(model: Model, text: str | Sequence[int], path: str | os.PathLike[str]) -> int:
    """Write a static n-gram cache for ``Speculative(method="ngram-cache", ngram_cache=path)``, in
    the format of upstream's llama-lookup-create (2-grams of the tokenized text).

    Args:
        model: the model whose tokenizer the cache is for.
        text: a corpus typical of what will be generated (text, or token ids).
        path: the file to write.

    Returns:
        The number of tokens the cache was built from.

    Raises:
        InvalidOptionError: a token id outside the vocabulary.
        LlamaspecError: the file cannot be written.
    """
    tokens = model.tokenize(text, add_special=False) if isinstance(text, str) else [int(t) for t in text]
    n_vocab = model.n_vocab
    if any(not 0 <= t < n_vocab for t in tokens):
        raise InvalidOptionError("a token id is outside the model's vocabulary")
    _native.ngram_cache_create(tokens, os.fspath(path))
    return len(tokens)
