"""The command line's shared options: one definition of each flag that `serve`, `run`, `chat` and `bench`
have in common (the model, the context, the threads, the drafter, sampling), spelled as llama.cpp's
tools spell them, and the session those flags describe.

Standard library only: the core package imports nothing else, and the server's parser
(server/config.py) builds on these functions instead of declaring the flags again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from ._options import normalize_methods
from .errors import InvalidOptionError
from .generator import Generator
from .model import Model
from .speculative import METHODS, Speculative

SAMPLING_FLAGS = (
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


def n_draft_arg(v: str) -> int | str:
    """argparse type of --n-draft: 'auto' or an int >= 0."""
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0 or 'auto', got {v!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0 or 'auto', got {v!r}")
    return n


def method_arg(v: str) -> str:
    """argparse type of --method: 'none', a method name or a comma-separated chain of them
    (llama-server's --spec-type)."""
    if v in ("none", "plain"):
        return "none"
    try:
        return ",".join(normalize_methods([n.strip() for n in v.split(",")]))
    except InvalidOptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_model_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """MODEL (positional), -m MODEL (llama.cpp's flag) or -hf REPO[:QUANT] (a Hugging Face Hub
    repository, as llama.cpp's tools); read back with :func:`model_path`."""
    p.add_argument("model_pos", nargs="?", metavar="MODEL", help=f"the GGUF file {what}")
    p.add_argument("-m", "--model", dest="model_opt", metavar="PATH", help="the GGUF file (llama.cpp's flag)")
    p.add_argument(
        "-hf",
        "--hf-repo",
        dest="hf_repo",
        metavar="REPO[:QUANT]",
        help="a Hugging Face Hub repository instead of a file: the GGUF with QUANT in its name (default "
        "Q4_K_M, else the first); the first use downloads it into the Hub cache (needs huggingface_hub)",
    )
    p.add_argument("-hff", "--hf-file", dest="hf_file", metavar="NAME",
                   help="with -hf: the file name or glob")


def model_path(p: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    """The model the command line names, as a local path (-hf downloads it when needed: a failure
    there is a ModelLoadError); a missing or doubled model is a usage error (exit 2)."""
    given = [v for v in (a.model_pos, a.model_opt, a.hf_repo) if v]
    if not given:
        p.error(f"a model is required: {p.prog} MODEL.gguf (or -m MODEL.gguf, or -hf REPO[:QUANT])")
    if len(given) > 1:
        p.error("give the model once: MODEL, -m or -hf")
    if a.hf_file and not a.hf_repo:
        p.error("--hf-file needs -hf REPO")
    if a.hf_repo:
        from ._hub import hub_file, split_repo

        repo, quant = split_repo(a.hf_repo)
        if quant and a.hf_file:
            p.error("give -hf REPO:QUANT or -hf REPO --hf-file NAME, not both")
        return hub_file(repo, a.hf_file, quant=quant)
    model: str = given[0]
    return model


def add_context_arguments(g: argparse._ArgumentGroup, ctx_help: str) -> None:
    """-c, -b, -ub, -t, -tb, -ngl, --rpc, --rpc-timeout."""
    g.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, default=0, help=ctx_help)
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, help="logical batch size")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, help="physical batch size")
    g.add_argument("-t", "--threads", dest="n_threads", type=int, help="threads for generation")
    g.add_argument("-tb", "--threads-batch", dest="n_threads_batch", type=int, help="threads for prompts")
    g.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="n_gpu_layers",
        type=int,
        help="layers to offload to the GPUs and RPC workers, -1 all (default: all with --rpc, else none)",
    )
    g.add_argument(
        "--rpc",
        dest="rpc_servers",
        metavar="HOST:PORT,...",
        type=lambda s: [e.strip() for e in s.split(",") if e.strip()],
        help="llama.cpp RPC workers (`llamaspec rpc-server`) that hold the offloaded layers (and the draft "
        "model's)",
    )
    g.add_argument(
        "--rpc-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="seconds an RPC worker may stay silent before it counts as failed (0: forever; default 120)",
    )


def model_options(a: argparse.Namespace) -> dict[str, Any]:
    """The Model options that add_context_arguments' flags give (-ngl, --rpc, --rpc-timeout)."""
    return {"n_gpu_layers": a.n_gpu_layers, "rpc_servers": a.rpc_servers, "rpc_timeout": a.rpc_timeout}


def add_n_predict_argument(g: argparse.ArgumentParser | argparse._ArgumentGroup, default: int,
                           what: str) -> None:
    """-n/--n-predict (llama.cpp's spelling), -1 meaning no limit but the context."""
    g.add_argument("-n", "--n-predict", "--predict", dest="n_predict", type=int, default=default, help=what)


def check_context_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """-c >= 0, and -t, -tb, -b, -ub >= 1 where given: otherwise a usage error (exit 2)."""
    if a.n_ctx < 0:
        p.error(f"-c/--ctx-size must be >= 0, got {a.n_ctx}")
    for flag, v in (("-t/--threads", a.n_threads), ("-tb/--threads-batch", a.n_threads_batch),
                    ("-b/--batch-size", a.n_batch), ("-ub/--ubatch-size", a.n_ubatch)):
        if v is not None and v < 1:
            p.error(f"{flag} must be >= 1, got {v}")
    if a.n_gpu_layers is not None and a.n_gpu_layers < -1:
        p.error(f"-ngl/--n-gpu-layers must be >= -1, got {a.n_gpu_layers}")
    if a.rpc_timeout < 0:
        p.error(f"--rpc-timeout must be >= 0, got {a.rpc_timeout}")


def add_speculative_arguments(p: argparse.ArgumentParser, several: bool = False) -> None:
    """--method, --draft-model, --n-draft, --draft-min, --draft-p-min (with llama.cpp's spellings);
    with ``several``, --n-draft takes one or more lengths (into ``n_drafts``: bench compares them)."""
    spec = p.add_argument_group("speculative decoding")
    method_dest: dict[str, Any] = dict(dest="methods", nargs="+") if several else dict(dest="method")
    spec.add_argument(
        "--method",
        "--spec-type",
        type=method_arg,
        help="drafter: none, " + ", ".join(METHODS) + " (a comma-separated chain; default: mtp when the "
        "model has MTP layers, draft with --draft-model, else none)"
        + ("; several to compare them" if several else ""),
        **method_dest,
    )
    spec.add_argument(
        "-md",
        "--draft-model",
        "--model-draft",
        "--spec-draft-model",
        dest="draft_model",
        help="a draft model GGUF",
    )
    lengths: dict[str, Any] = (
        dict(dest="n_drafts", nargs="+", default=["auto", 3],
             help="the draft lengths to compare with plain decoding, 'auto' included (default: auto 3; "
             "give MODEL before them)")
        if several else
        dict(dest="n_draft", default="auto",
             help="draft length per verify: 'auto' (the default: chosen per verify from measured acceptance "
             "and costs, plain decoding when drafting does not pay) or a fixed longest draft")
    )
    spec.add_argument(
        "--n-draft", "--draft-max", "--draft", "--draft-n", "--spec-draft-n-max", type=n_draft_arg, **lengths
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


def add_sampling_arguments(p: argparse.ArgumentParser, title: str) -> None:
    """--temp, --top-k, --top-p, --min-p, -s, the penalties; unset ones stay None (the library's
    defaults); read back with :func:`sampling_from_args`."""
    samp = p.add_argument_group(title)
    samp.add_argument("--temp", "--temperature", dest="temperature", type=float)
    samp.add_argument("--top-k", dest="top_k", type=int)
    samp.add_argument("--top-p", dest="top_p", type=float)
    samp.add_argument("--min-p", dest="min_p", type=float)
    samp.add_argument("-s", "--seed", dest="seed", type=int)
    samp.add_argument("--repeat-penalty", dest="repeat_penalty", type=float)
    samp.add_argument("--repeat-last-n", dest="penalty_last_n", type=int)
    samp.add_argument("--presence-penalty", dest="presence_penalty", type=float)
    samp.add_argument("--frequency-penalty", dest="frequency_penalty", type=float)
    out = p.add_argument_group("constrained output (one of)")
    out.add_argument("-j", "--json-schema", dest="json_schema", metavar="JSON",
                     help="a JSON Schema (its JSON text) that the output follows")
    out.add_argument("-jf", "--json-schema-file", dest="json_schema_file", metavar="FILE",
                     help="the same, read from a file")
    out.add_argument("--grammar", dest="grammar", metavar="GBNF",
                     help="a GBNF grammar that the output follows")
    out.add_argument("--grammar-file", dest="grammar_file", metavar="FILE", help="the same, read from a file")


def sampling_from_args(a: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags that were given, as library options (a negative seed is llama.cpp's -1: a
    random seed, so it is left out). The schema or grammar files are read here.

    Raises:
        InvalidOptionError: more than one of the constrained-output flags, or a schema that is not
            JSON (the schema itself is checked when a call converts it).
        OSError, UnicodeError: a file that cannot be read.
    """
    out = {k: getattr(a, k) for k in SAMPLING_FLAGS if getattr(a, k) is not None}
    if out.get("seed", 0) < 0:
        out.pop("seed")
    flags = ("json_schema", "json_schema_file", "grammar", "grammar_file")
    given = [f for f in flags if getattr(a, f, None) is not None]
    if len(given) > 1:
        raise InvalidOptionError("give one of -j/--json-schema, -jf/--json-schema-file, --grammar, "
                                 "--grammar-file")
    if given:
        flag = given[0]
        value: str = getattr(a, flag)
        text = Path(value).read_text(encoding="utf-8") if flag.endswith("_file") else value
        if flag.startswith("grammar"):
            out["grammar"] = text
        else:
            try:
                out["json_schema"] = json.loads(text)
            except json.JSONDecodeError as e:
                raise InvalidOptionError(f"the JSON schema is not valid JSON: {e}") from None
    return out


def open_session(
    model: Model,
    *,
    method: str | None,
    draft_model: str | None,
    n_draft: int | Literal["auto"],
    n_draft_min: int,
    p_min: float,
    n_seq: int,
    n_ctx: int,
    draft_options: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[Generator | Speculative, str]:
    """The session the flags describe: (session, method name or "none"). With no --method, MTP when
    the model has MTP layers, a draft model when one is given, else plain decoding; --n-draft 0 or
    --method none is plain decoding. ``draft_options`` load the draft model (as Model options);
    ``options`` go to the session as they are (n_threads, ...)."""
    if method is None:
        method = "mtp" if model.has_mtp else ("draft" if draft_model else "none")
    if method == "none" or n_draft == 0:
        return Generator(model, n_seq=n_seq, n_ctx=n_ctx, **options), "none"
    spec = Speculative(
        model,
        method=method.split(","),
        n_draft=n_draft,
        n_draft_min=n_draft_min,
        p_min=p_min,
        draft_model=draft_model,
        draft_options=draft_options if draft_model is not None else None,
        n_ctx=n_ctx,
        n_seq=n_seq,
        **options,
    )
    return spec, method


def session_from_args(model: Model, a: Any, n_ctx: int, n_seq: int = 1,
                      **options: Any) -> tuple[Generator | Speculative, str]:
    """:func:`open_session` with the drafter, threads and batch settings of ``a``: the parsed flags,
    or any object with those attributes (method, draft_model, n_draft, n_draft_min, p_min, n_threads,
    n_threads_batch, n_batch, n_ubatch, rpc_servers, rpc_timeout), e.g. the server's config; ``options``
    go to the session too. With --rpc, the draft model goes on the same workers (as upstream's)."""
    rpc = list(a.rpc_servers or ())
    return open_session(
        model,
        method=a.method,
        draft_model=a.draft_model,
        draft_options={"rpc_servers": rpc, "rpc_timeout": a.rpc_timeout} if rpc else None,
        n_draft=a.n_draft,
        n_draft_min=a.n_draft_min,
        p_min=a.p_min,
        n_seq=n_seq,
        n_ctx=n_ctx,
        **context_options(a),
        **options,
    )


def context_options(a: object) -> dict[str, int]:
    """The threads and batch settings that were given (flags, or any object with the attributes
    n_threads, n_threads_batch, n_batch and n_ubatch, e.g. the server's config), as session options."""
    return {
        k: v
        for k in ("n_threads", "n_threads_batch", "n_batch", "n_ubatch")
        if (v := getattr(a, k)) is not None
    }
