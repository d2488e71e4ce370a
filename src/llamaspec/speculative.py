"""Speculative decoding: every drafter upstream llama.cpp implements, chained or alone, behind one
session type (``Speculative``); ``MTP`` is ``Speculative`` with ``method="mtp"``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from . import _native
from ._log import sync_log_level
from ._options import (
    METHOD_ALIASES,
    METHODS,
    NEEDS_DRAFT_MODEL,
    NGRAM_OPTIONS,
    int_option,
    ngram_cache_paths,
    normalize_methods,
    prompt_cache_config,
    session_context_options,
)
from ._session import _StreamingSession
from .errors import DraftModelRequiredError, InvalidOptionError, UnsupportedModelError
from .model import Model

__all__ = ["Speculative", "MTP", "METHODS", "METHOD_ALIASES", "DEFAULT_N_DRAFT_MAX"]

#: The longest draft ``n_draft="auto"`` may choose when ``n_draft_max`` is not given, per method
#: (upstream names). It only bounds the choice; the policy drafts shorter where that pays (ADR 0009).
DEFAULT_N_DRAFT_MAX: dict[str, int] = {m: 8 for m in METHODS}

class Speculative(_StreamingSession):
    """Speculative decoding with any drafter upstream llama.cpp implements, alone or chained.

    Methods (upstream names; short forms in brackets):

    * ``draft-mtp`` ("mtp"): the model's own Multi-Token-Prediction head (e.g. Qwen3.5/3.6 "-MTP").
    * ``draft-simple`` ("draft"): a separate, smaller model with a compatible vocabulary.
    * ``draft-eagle3`` ("eagle3"), ``draft-dflash`` ("dflash"), ``draft-dspark`` ("dspark"): drafter
      heads trained for the target, which read its hidden states; pass the drafter file as draft_model.
    * ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``, ``ngram-cache``:
      self-speculation from n-grams of the prompt and the generation so far (no drafter model).

    A list chains stages: for each draft, the stages are tried in upstream's order of priority
    (the n-gram methods first, then the model-based one) and the first that proposes a draft wins;
    at most one model-based stage. Output is identical to plain decoding with the same sampling
    options (greedy: token for token; seeded sampling: the target draws one sample per emitted
    token, as plain decoding does). One generation at a time; every call starts from a clean KV
    cache and recurrent state (the n-gram stages keep what they learned across calls: ngram-mod's
    table and the dynamic caches); ``stats()`` may be read from any thread at any time.

    Example:
        >>> target = llamaspec.Model("Qwen3-8B-Q4_K_M.gguf")
        >>> with llamaspec.Speculative(target, method="draft", draft_model="Qwen3-0.6B-Q8_0.gguf",
        ...                            n_draft=8, n_ctx=8192) as spec:
        ...     print(spec.generate("Write a haiku about the sea:", max_tokens=200))
        ...     print(spec.stats().acceptance_rate)
    """

    def __init__(
        self,
        model: Model,
        *,
        method: str | Sequence[str],
        n_draft: int | Literal["auto"] = "auto",
        n_draft_max: int | None = None,
        n_draft_min: int = 0,
        p_min: float = 0.0,
        draft_model: Model | str | os.PathLike[str] | None = None,
        draft_options: Mapping[str, Any] | None = None,
        ngram_cache: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]] | None = None,
        ngram_options: Mapping[str, int] | None = None,
        n_ctx: int = 2048,
        n_seq: int = 1,
        ctx_checkpoints: int = 8,
        checkpoint_every: int = 8192,
        prompt_cache_mb: int = 0,
        **options: Any,
    ) -> None:
        """Check the configuration, load the draft model if given as a path, and build the target
        context, the draft context (model-based methods) and the speculative state.

        Args:
            model: the target model. For "mtp" it must carry MTP layers and be loaded with
                ``load_mtp=True`` (the default).
            method: a method name or a list of names (chained stages); see the class docstring.
            n_draft: "auto" (the default): the session chooses the length for each verify, up to
                ``n_draft_max``, from the acceptance it observes and the draft and verify costs it
                measures, down to 0 (plain decoding) when drafting does not pay (ADR 0009); or a
                fixed maximum of draft tokens per verify, for every stage (>= 1). It also sets how
                far the target's recurrent state can be rolled back (hybrid models).
            n_draft_max: with ``n_draft="auto"``, the longest draft (default
                ``DEFAULT_N_DRAFT_MAX`` of the method, the largest among chained stages); it sizes the
                rollback snapshots, output rows and per-position statistics. With an int n_draft,
                None or equal to it.
            n_draft_min: drafts shorter than this are dropped (draft models and ngram-mod), in
                [0, n_draft].
            p_min: draft models stop drafting at a token whose probability is below this, in [0, 1].
            draft_model: the drafter for "draft", "eagle3", "dflash" and "dspark": a path (loaded
                here with ``draft_options``, closed with the session) or a loaded Model.
            draft_options: Model options for loading ``draft_model`` from a path (e.g.
                ``n_gpu_layers``); an error with a loaded Model.
            ngram_cache: for "ngram-cache": the static cache file (a path, see ngram_cache_create)
                or ``{"static": path, "dynamic": path}`` (llama-lookup's file format).
            ngram_options: n-gram tuning: "size_n" (key length of ngram-simple / -map-k / -map-k4v,
                default 12), "min_hits" (ngram-map-k / -k4v, default 1), "n_match" (ngram-mod,
                default 24).
            n_ctx: context size of each sequence, for the target and the draft context.
            n_seq: sequences decoded together, in [1, 64]: up to n_seq calls (``stream`` from
                different threads or tasks, ``generate_batch``) run at once, each on its own
                sequence, and share every draft and verify pass (with ``n_draft="auto"`` the
                lengths are chosen for each step's sequences together).
            ctx_checkpoints, checkpoint_every, prompt_cache_mb: the prompt cache, as for Generator
                (README, "Prompt cache"); the drafter's state is checkpointed and saved with the
                target's.
            **options: other context options (see Context), applied to both contexts. ``n_batch``
                must hold a verify of every sequence: n_seq * (1 + n_draft) tokens.

        Raises:
            InvalidOptionError: an unknown method, a bad combination or value (n_draft, n_draft_min,
                p_min, draft_options with a loaded Model, draft_model with a method that uses none,
                ngram options, an unreadable or malformed ngram cache file).
            DraftModelRequiredError: the method needs a draft_model and none was given.
            IncompatibleVocabError: the draft model's vocabulary does not match the target's.
            UnsupportedModelError: the target has no MTP layers (for "mtp"), or the drafter file is
                not of the method's architecture, or a recurrent model cannot be rolled back.
            ModelLoadError: draft_model is a path that cannot be loaded.
            TypeError: an unknown context option.
        """
        self._owned_draft: Model | None = None
        methods = normalize_methods(method)
        adaptive = n_draft == "auto"
        if adaptive:
            cap = max(DEFAULT_N_DRAFT_MAX[m] for m in methods) if n_draft_max is None else n_draft_max
            n_draft = int_option("n_draft_max", cap, 1, 1 << 12)
        else:
            n_draft = int_option("n_draft", n_draft, 1, 1 << 12)
            if n_draft_max is not None and n_draft_max != n_draft:
                raise InvalidOptionError("n_draft_max applies to n_draft='auto' (with an int n_draft it is n_draft)")
        n_draft_min = int_option("n_draft_min", n_draft_min, 0, n_draft)
        n_seq = int_option("n_seq", n_seq, 1, 64)
        cache = prompt_cache_config(ctx_checkpoints, checkpoint_every, prompt_cache_mb)
        if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0.0 <= p_min <= 1.0:
            raise InvalidOptionError(f"p_min must be a number within [0, 1], got {p_min!r}")
        config: dict[str, Any] = {"methods": methods, "n_draft": n_draft, "n_draft_min": n_draft_min,
                                  "p_min": float(p_min), "adaptive": adaptive, "n_seq": n_seq, **cache}
        if ngram_options is not None:
            if not isinstance(ngram_options, Mapping):
                raise InvalidOptionError(f"ngram_options must be a mapping, got {ngram_options!r}")
            if not any(m.startswith("ngram-") for m in methods):
                raise InvalidOptionError("ngram_options is only used by the ngram-* methods")
            for k, v in ngram_options.items():
                if k not in NGRAM_OPTIONS:
                    raise InvalidOptionError(f"unknown ngram option {k!r}; known: {', '.join(NGRAM_OPTIONS)}")
                lo, hi = NGRAM_OPTIONS[k]
                config["ngram_mod_n_match" if k == "n_match" else f"ngram_{k}"] = int_option(k, v, lo, hi)
        if ngram_cache is not None:
            if "ngram-cache" not in methods:
                raise InvalidOptionError("ngram_cache is only used by the ngram-cache method")
            config["ngram_cache_static"], config["ngram_cache_dynamic"] = ngram_cache_paths(ngram_cache)

        needs_draft = any(m in NEEDS_DRAFT_MODEL for m in methods)
        if draft_options is not None and not isinstance(draft_options, Mapping):
            raise InvalidOptionError(f"draft_options must be a mapping, got {draft_options!r}")
        if draft_model is None:
            if needs_draft:
                which = next(m for m in methods if m in NEEDS_DRAFT_MODEL)
                raise DraftModelRequiredError(f"method {which!r} drafts with a separate model: pass draft_model")
            if draft_options is not None:
                raise InvalidOptionError("draft_options is only used when draft_model is a path")
        elif not needs_draft:
            raise InvalidOptionError("draft_model is only used by draft-simple, draft-eagle3, draft-dflash and "
                                     f"draft-dspark (methods: {methods})")
        opts = session_context_options({"n_ctx": n_ctx, **options})
        native_model = model._require()
        if "draft-mtp" in methods and model.n_layer_nextn <= 0:
            raise UnsupportedModelError(
                f"'{model.path}' has no MTP layers (nextn_predict_layers is 0 or absent in the file); "
                "MTP needs a GGUF that carries an MTP head (e.g. a Qwen3.5/3.6 '-MTP' quant)",
                path=model.path,
            )
        if isinstance(draft_model, Model):
            if draft_options is not None:
                raise InvalidOptionError("draft_options applies to loading draft_model from a path; "
                                         "this draft_model is already loaded")
            dm: Model | None = draft_model
        elif draft_model is not None:
            if not isinstance(draft_model, (str, os.PathLike)):
                raise InvalidOptionError(f"draft_model must be a Model or a path, got {draft_model!r}")
            dm = self._owned_draft = Model(draft_model, **dict(draft_options or {}))
        else:
            dm = None
        sync_log_level()
        try:
            native = _native.Session.create(native_model, opts, config, dm._require() if dm is not None else None)
        except BaseException:
            if self._owned_draft is not None:
                self._owned_draft.close()
            raise
        self._init_session(model, native, opts, n_seq)
        self._draft_model = dm
        self._n_draft = n_draft
        self._adaptive = adaptive
        self._methods = tuple(native.methods)

    @property
    def n_draft(self) -> int | Literal["auto"]:
        """The draft length asked for: the fixed length, or ``"auto"`` (the session chooses it per
        verify, up to n_draft_max)."""
        return "auto" if self._adaptive else self._n_draft

    @property
    def n_draft_max(self) -> int:
        """The longest draft a verify may carry (the fixed n_draft, or the cap of ``"auto"``)."""
        return self._n_draft

    @property
    def adaptive(self) -> bool:
        """True when the session chooses the draft length per verify (``n_draft="auto"``)."""
        return self._adaptive

    @property
    def methods(self) -> tuple[str, ...]:
        """The stages (upstream names), in the order they are tried for each draft."""
        return self._methods

    @property
    def draft_model(self) -> Model | None:
        """The draft model (model-based methods other than MTP), else None."""
        return self._draft_model

    def close(self) -> None:
        """Stop a running generation, free the contexts and a draft model loaded from a path. Idempotent."""
        super().close()
        if self._owned_draft is not None:
            self._owned_draft.close()  # the native draft context keeps the weights until it is gone

    def __repr__(self) -> str:
        methods = list(getattr(self, "_methods", ()))
        n_draft = "auto" if getattr(self, "_adaptive", False) else getattr(self, "_n_draft", None)
        return (f"<llamaspec.{type(self).__name__} methods={methods} n_draft={n_draft} "
                f"model={getattr(self, '_model', None)!r}>")


class MTP(Speculative):
    """Speculative decoding with the model's own Multi-Token-Prediction head as the drafter:
    ``Speculative(model, method="mtp", ...)``.

    Example:
        >>> model = llamaspec.Model("Qwen3.6-35B-A3B-MTP-Q4_K_M.gguf")
        >>> with llamaspec.MTP(model, n_ctx=8192) as mtp:
        ...     for piece in mtp.stream("Write a haiku about the sea:", max_tokens=200):
        ...         print(piece, end="")
        ...     print(mtp.stats().acceptance_rate)
    """

    def __init__(self, model: Model, *, n_draft: int | Literal["auto"] = "auto", n_ctx: int = 2048,
                 **options: Any) -> None:
        """Build the target context, the MTP draft context and the speculative state.

        Args:
            model: a model whose file carries MTP layers, loaded with ``load_mtp=True`` (the default).
            n_draft: "auto" (the default: chosen per verify, see Speculative) or a fixed maximum of
                draft tokens per verify (>= 1).
            n_ctx: context size for both contexts.
            **options: other context options (see Context), applied to both contexts, and
                Speculative's n_draft_max / n_draft_min / p_min.

        Raises:
            InvalidOptionError: n_draft is not an int >= 1, or an option value is invalid.
            TypeError: an unknown option.
            UnsupportedModelError: the model has no MTP layers, or was loaded with load_mtp=False.
        """
        if "method" in options:
            raise TypeError("MTP() takes no 'method' (use Speculative for other methods)")
        super().__init__(model, method="mtp", n_draft=n_draft, n_ctx=n_ctx, **options)
