"""Models by name: a GGUF file of a Hugging Face Hub repository, through ``huggingface_hub`` (an
optional dependency: ``pip install 'llamaspec[hub]'``) with its cache, token and offline mode as
usual (``HF_HOME``/``HF_HUB_CACHE``, ``HF_TOKEN``, ``HF_HUB_OFFLINE=1``).

Which file: a name or glob when given; else a quantization tag (``repo:Q8_0``: the GGUF whose name
holds it, in any case); else Q4_K_M when the repository has one (llama.cpp's ``-hf`` default), else
the first GGUF by name. Projector files (``mmproj*``) are never chosen. A model split into parts
(``-00001-of-00003.gguf``) comes with all its parts and loads from the first. Online, only the
chosen files are downloaded (``hf_hub_download``, each by its name); offline (or when the Hub
cannot be reached) the choice is made among the files already in the cache.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence

from .errors import ModelLoadError

_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
DEFAULT_QUANT = "Q4_K_M"


def split_repo(spec: str) -> tuple[str, str | None]:
    """``"org/name:Q8_0"`` -> ("org/name", "Q8_0"); no tag -> (spec, None)."""
    repo, _, quant = spec.partition(":")
    return repo, (quant or None)


def choose(names: Sequence[str], filename: str | None, quant: str | None, repo_id: str) -> list[str]:
    """The repository files to fetch (the model, or all parts of a split one; the first loads)."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf")
                   and not os.path.basename(n).lower().startswith("mmproj"))
    if filename is not None:
        matches = [n for n in ggufs if fnmatch.fnmatchcase(n, filename)
                   or fnmatch.fnmatchcase(os.path.basename(n), filename)]
        wanted = f"matching {filename!r}"
    elif quant is not None:
        matches = [n for n in ggufs if quant.lower() in os.path.basename(n).lower()]
        wanted = f"with {quant!r} in its name"
    else:
        matches = [n for n in ggufs if DEFAULT_QUANT.lower() in os.path.basename(n).lower()] or ggufs
        wanted = "at all"
    if not matches:
        some = ", ".join(os.path.basename(n) for n in ggufs[:8]) or "none"
        raise ModelLoadError(f"{repo_id} has no GGUF file {wanted} (GGUF files: {some})")
    first = matches[0]
    m = _SPLIT.match(first)
    if m is None:
        return [first]
    prefix, total = m.group(1), m.group(3)
    parts = [n for n in ggufs if (p := _SPLIT.match(n)) and p.group(1) == prefix and p.group(3) == total]
    return sorted(parts)


def hub_file(repo_id: str, filename: str | None = None, *, quant: str | None = None,
             revision: str | None = None, cache_dir: str | None = None, token: str | None = None) -> str:
    """The local path of the chosen GGUF file of ``repo_id``, downloaded into the Hub cache when
    needed (see the module docstring for the choice).

    Raises:
        ModelLoadError: huggingface_hub is missing, the repository or file cannot be had (not on
            the Hub, no access, offline and not cached), or no file matches.
    """
    try:
        import huggingface_hub
    except ImportError as e:
        raise ModelLoadError(
            f"models by name need huggingface_hub: pip install 'llamaspec[hub]' ({e})"
        ) from e

    def failed(e: BaseException) -> ModelLoadError:
        message = " ".join(str(e).split()) or type(e).__name__
        return ModelLoadError(f"cannot get {repo_id} from the Hugging Face Hub: {message}")

    try:  # which files the repository has (offline, or the Hub unreachable: see the cache below)
        names: list[str] | None = huggingface_hub.list_repo_files(repo_id, revision=revision, token=token)
        listing_error: Exception | None = None
    except Exception as e:  # huggingface_hub's errors: offline, not found, gated, no network, ...
        names, listing_error = None, e
    if names is not None:
        chosen = choose(names, filename, quant, repo_id)
        try:  # each chosen file by its name (not as a pattern: a name may hold [ or *)
            paths = [huggingface_hub.hf_hub_download(repo_id, name, revision=revision, cache_dir=cache_dir,
                                                     token=token) for name in chosen]
        except Exception as e:
            raise failed(e) from e
        return paths[0]
    try:
        folder = huggingface_hub.snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                                   token=token, local_files_only=True)
    except Exception as e:  # not cached either: the listing's error says why
        raise failed(listing_error or e) from e
    cached = [os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
              for d, _, files in os.walk(folder) for f in files]
    return os.path.join(folder, choose(cached, filename, quant, repo_id)[0])
