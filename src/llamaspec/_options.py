"""Validation of keyword options, before anything native runs.

An unknown name raises TypeError (as Python does for an unexpected keyword argument); a value of the
wrong type or out of range raises InvalidOptionError (a ValueError).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import InvalidOptionError

Checker = Callable[[str, Any], Any]


def _int(lo: int | None = None, hi: int | None = None, *, none_ok: bool = False) -> Checker:
    def check(name: str, v: Any) -> Any:
        if v is None and none_ok:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidOptionError(f"{name} must be an int, not {type(v).__name__}")
        if lo is not None and v < lo:
            raise InvalidOptionError(f"{name} must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise InvalidOptionError(f"{name} must be <= {hi}, got {v}")
        return v

    return check


def _float(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> Checker:
    def check(name: str, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidOptionError(f"{name} must be a number, not {type(v).__name__}")
        f = float(v)
        if not math.isfinite(f):
            raise InvalidOptionError(f"{name} must be finite, got {v}")
        if lo is not None and (f <= lo if lo_open else f < lo):
            raise InvalidOptionError(f"{name} must be {'>' if lo_open else '>='} {lo}, got {v}")
        if hi is not None and f > hi:
            raise InvalidOptionError(f"{name} must be <= {hi}, got {v}")
        return f

    return check


def _bool(name: str, v: Any) -> Any:
    if not isinstance(v, bool):
        raise InvalidOptionError(f"{name} must be a bool, not {type(v).__name__}")
    return v


def _choice(*choices: str, none_ok: bool = False) -> Checker:
    def check(name: str, v: Any) -> Any:
        if v is None and none_ok:
            return None
        if v not in choices:
            raise InvalidOptionError(f"{name} must be one of {', '.join(map(repr, choices))}; got {v!r}")
        return v

    return check


def _flash_attn(name: str, v: Any) -> Any:
    if isinstance(v, bool):
        return "on" if v else "off"
    return _choice("auto", "on", "off")(name, v)


CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

#: Context options shared by Context, Generator and (later) the speculative sessions.
CONTEXT_OPTIONS: dict[str, Checker] = {
    "n_ctx": _int(0),
    "n_threads": _int(1, none_ok=True),
    "n_threads_batch": _int(1, none_ok=True),
    "n_batch": _int(1),
    "n_ubatch": _int(1),
    "n_seq_max": _int(1, 256),
    "type_k": _choice(*CACHE_TYPES),
    "type_v": _choice(*CACHE_TYPES),
    "flash_attn": _flash_attn,
    "offload_kqv": _bool,
    "op_offload": _bool,
    "rope_scaling_type": _choice("none", "linear", "yarn", "longrope", none_ok=True),
    "rope_freq_base": _float(0.0),
    "rope_freq_scale": _float(0.0),
    "yarn_ext_factor": _float(),
    "yarn_attn_factor": _float(0.0),
    "yarn_beta_fast": _float(),
    "yarn_beta_slow": _float(),
    "yarn_orig_ctx": _int(0),
    "attention_type": _choice("causal", "non_causal", none_ok=True),
    "no_perf": _bool,
    "swa_full": _bool,
    "kv_unified": _bool,
}

CONTEXT_DEFAULTS: dict[str, Any] = {"n_ctx": 2048}


def _stop(name: str, v: Any) -> list[str]:
    if v is None:
        return []
    items = [v] if isinstance(v, str) else v
    try:
        out = list(items)
    except TypeError:
        raise InvalidOptionError(f"{name} must be a str or a list of str") from None
    for s in out:
        if not isinstance(s, str) or not s:
            raise InvalidOptionError(f"{name} entries must be non-empty strings, got {s!r}")
    return out


def _str_or_none(name: str, v: Any) -> Any:
    if v is not None and not isinstance(v, str):
        raise InvalidOptionError(f"{name} must be a str, not {type(v).__name__}")
    return v


def _mapping_or_none(name: str, v: Any) -> Any:
    if v is not None and not isinstance(v, Mapping):
        raise InvalidOptionError(f"{name} must be a dict, not {type(v).__name__}")
    return v


def _logit_bias(name: str, v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise InvalidOptionError(f"{name} must be a dict of token id -> bias")
    out = []
    for k, b in v.items():
        _int(0)(f"{name} key", k)
        if isinstance(b, bool) or not isinstance(b, (int, float)) or math.isnan(b):
            raise InvalidOptionError(f"{name}[{k}] must be a number (or -inf), got {b!r}")
        out.append((int(k), float(b)))
    return out


def call_options(prompt_progress: Any, draft_max: Any, p_min: Any,
                 cache_prompt: Any) -> tuple[bool, int, float, bool]:
    """The per-call options beside sampling, checked; the native sentinels for "the session's" (-1)."""
    _bool("prompt_progress", prompt_progress)
    cap = _int(0, none_ok=True)("draft_max", draft_max)
    threshold = None if p_min is None else _float(0.0, 1.0)("p_min", p_min)
    _bool("cache_prompt", cache_prompt)
    return (prompt_progress, -1 if cap is None else cap, -1.0 if threshold is None else threshold,
            cache_prompt)


def logprobs_options(opts: dict[str, Any]) -> tuple[int, bool]:
    """Take the log-probability options out of validated sampling options: the native form, top
    candidates per token (-1: off), and whether they are read after the sampler's filters."""
    on = opts.pop("logprobs", False)
    top = opts.pop("top_logprobs", None)
    post = opts.pop("post_sampling_probs", False)
    if not on and (top is not None or post):
        raise InvalidOptionError(f"{'top_logprobs' if top is not None else 'post_sampling_probs'} "
                                 "needs logprobs=True")
    return (top or 0) if on else -1, post


#: Sampling options of every generation call, with llama.cpp's common defaults (README, "Sampling").
SAMPLING_OPTIONS: dict[str, Checker] = {
    "temperature": _float(),
    "top_k": _int(),
    "top_p": _float(0.0, 1.0),
    "min_p": _float(0.0, 1.0),
    "typical_p": _float(0.0, 1.0),
    "min_keep": _int(0),
    "seed": _int(0, 0xFFFFFFFE, none_ok=True),
    "repeat_penalty": _float(0.0, lo_open=True),
    "frequency_penalty": _float(),
    "presence_penalty": _float(),
    "penalty_last_n": _int(-1),
    "dry_multiplier": _float(0.0),
    "dry_base": _float(0.0),
    "dry_allowed_length": _int(0),
    "dry_penalty_last_n": _int(-1),
    "xtc_probability": _float(0.0, 1.0),
    "xtc_threshold": _float(0.0, 1.0),
    "mirostat": _choice(0, 1, 2),  # type: ignore[arg-type]
    "mirostat_tau": _float(0.0),
    "mirostat_eta": _float(0.0),
    "logit_bias": _logit_bias,
    "grammar": _str_or_none,
    "grammar_root": _str_or_none,
    "json_schema": _mapping_or_none,  # converted into grammar (llamaspec.grammar)
    "stop": _stop,
    # not sampling proper: what each Token event reports (log-probabilities); see logprobs_options
    "logprobs": _bool,
    "top_logprobs": _int(0, 20, none_ok=True),
    "post_sampling_probs": _bool,
}

#: Model.embed's pooling names and llama.cpp's llama_pooling_type values for them.
POOLING_TYPES = {"mean": 1, "cls": 2, "last": 3}

#: Sampling fields a chat template's tools set (ChatPrompt.sampling(); never a caller's option): the
#: tool-call grammar, lazy until one of its triggers appears; the tokens that stay text; the text the
#: template put at the start of the assistant's turn (a forced grammar starts after it).
CHAT_SAMPLING_FIELDS = (
    "tool_grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens", "generation_prompt"
)

SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "penalty_last_n": 64,
    "seed": None,
}


def validate(kind: str, table: Mapping[str, Checker], options: Mapping[str, Any]) -> dict[str, Any]:
    """Check every option by its table entry.

    Args:
        kind: what the options are for, used in messages ("context option").
        table: name -> checker.
        options: the user's keyword arguments.

    Returns:
        The normalized options.

    Raises:
        TypeError: an unknown option name.
        InvalidOptionError: an invalid value.
    """
    out: dict[str, Any] = {}
    for name, value in options.items():
        check = table.get(name)
        if check is None:
            raise TypeError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(table))}")
        out[name] = check(name, value)
    return out


def context_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate context options and fill llamaspec's defaults (``n_ctx=2048``)."""
    out = dict(CONTEXT_DEFAULTS)
    out.update(validate("context option", CONTEXT_OPTIONS, options))
    nb, nub = out.get("n_batch"), out.get("n_ubatch")
    if nb is not None and nub is not None and nub > nb:
        raise InvalidOptionError(f"n_ubatch ({nub}) must not exceed n_batch ({nb})")
    return out


#: Context options a session sets itself: it decodes n_seq sequences of n_ctx tokens each, in
#: separate cache streams.
SESSION_MANAGED = {"n_seq_max": "n_seq", "kv_unified": "n_seq"}


def session_context_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the context options of a session (Generator, Speculative): context_options, less the
    ones the session sets itself (InvalidOptionError, naming the session option to use instead)."""
    for name, instead in SESSION_MANAGED.items():
        if name in options:
            raise InvalidOptionError(f"{name} is set by the session (it decodes {instead} sequences of n_ctx "
                                     f"tokens each, in separate cache streams); use {instead}= instead")
    return context_options(options)


def sampling_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate sampling options; a missing or None seed becomes a random one (reported in Done)."""
    out = validate("sampling option", SAMPLING_OPTIONS, options)
    if out.get("seed") is None:
        out["seed"] = random.SystemRandom().randrange(0, 0xFFFFFFFF)
    return out


# -- speculative sessions -------------------------------------------------------------------------

#: Every method upstream's common_speculative implements, by its upstream name.
METHODS: tuple[str, ...] = (
    "draft-mtp", "draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark",
    "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)
#: Short forms accepted for the model-based methods.
METHOD_ALIASES: dict[str, str] = {
    "mtp": "draft-mtp", "draft": "draft-simple", "eagle3": "draft-eagle3", "dflash": "draft-dflash",
    "dspark": "draft-dspark",
}
NEEDS_DRAFT_MODEL = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
NGRAM_OPTIONS = {"size_n": (1, 256), "min_hits": (1, 1 << 15), "n_match": (1, 1024)}


def normalize_methods(method: Any) -> list[str]:
    names = [method] if isinstance(method, str) else method
    if not isinstance(names, Sequence) or isinstance(names, (bytes, bytearray)) or not names:
        raise InvalidOptionError(f"method must be a method name or a non-empty list of names, got {method!r}")
    out: list[str] = []
    for n in names:
        if not isinstance(n, str):
            raise InvalidOptionError(f"method names must be str, got {n!r}")
        full = METHOD_ALIASES.get(n, n)
        if full not in METHODS:
            known = ", ".join(METHODS + tuple(METHOD_ALIASES))
            raise InvalidOptionError(f"unknown speculative method {n!r}; known: {known}")
        if full in out:
            raise InvalidOptionError(f"speculative method {n!r} is given twice")
        out.append(full)
    if sum(m in NEEDS_DRAFT_MODEL or m == "draft-mtp" for m in out) > 1:
        raise InvalidOptionError(f"at most one model-based method can be chained (got {out}); "
                                 "chain it with n-gram methods")
    return out


def int_option(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidOptionError(f"{name} must be an int within [{lo}, {hi}], got {v!r}")
    return v


def prompt_cache_config(ctx_checkpoints: Any, checkpoint_every: Any, prompt_cache_mb: Any) -> dict[str, int]:
    """A session's prompt-cache options (Generator, Speculative), checked, for its native config."""
    return {
        "ctx_checkpoints": int_option("ctx_checkpoints", ctx_checkpoints, 0, 1024),
        "checkpoint_every": int_option("checkpoint_every", checkpoint_every, 0, 1 << 30),
        "prompt_cache_mb": int_option("prompt_cache_mb", prompt_cache_mb, -1, 1 << 30),
    }


def ngram_cache_paths(v: Any) -> tuple[str, str]:
    if isinstance(v, (str, os.PathLike)):
        return os.fspath(v), ""
    if isinstance(v, Mapping):
        unknown = set(v) - {"static", "dynamic"}
        if unknown or not v:
            raise InvalidOptionError(f"ngram_cache takes the keys 'static' and 'dynamic', got {sorted(map(str, v))}")
        paths = []
        for k in ("static", "dynamic"):
            p = v.get(k)
            if p is not None and not isinstance(p, (str, os.PathLike)):
                raise InvalidOptionError(f"ngram_cache[{k!r}] must be a path, got {p!r}")
            paths.append(os.fspath(p) if p is not None else "")
        return paths[0], paths[1]
    raise InvalidOptionError(f"ngram_cache must be a path or a mapping {{'static': path, 'dynamic': path}}, got {v!r}")
