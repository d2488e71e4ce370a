#!/usr/bin/env python3
"""Fetch the pinned llama.cpp source tree, verify it, and cache it outside the repository.

llama.cpp is not published as a library with headers on any package registry. The one registry
artifact that carries a complete tree (``common/`` included) is the source distribution of
llama-cpp-python, whose ``vendor/llama.cpp`` is upstream ggml-org/llama.cpp at a known commit.
This script downloads that file through pip (so the user's pip configuration applies), checks
its sha256, extracts only ``vendor/llama.cpp``, applies ``patches/*.patch`` in name order and
prints the path of the ready tree. Everything is cached: a second run prints the path at once.

Usage: python cmake/fetch_llama_cpp.py [--cache-dir DIR] [--patches DIR]
The cache directory defaults to $LLAMASPEC_CACHE_DIR, else $XDG_CACHE_HOME/llamaspec, else
~/.cache/llamaspec. Only the path is written to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_SIZE = 76_589_250
TREE_PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
LLAMA_CPP_COMMIT = "0c1e57098"


def default_cache_dir() -> Path:
    env = os.environ.get("LLAMASPEC_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "llamaspec"


def log(msg: str) -> None:
    print(f"[llamaspec] {msg}", file=sys.stderr, flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def obtain_sdist(dl_dir: Path) -> Path:
    sdist = dl_dir / SDIST_FILE
    if sdist.is_file() and sha256_of(sdist) == SDIST_SHA256:
        return sdist
    dl_dir.mkdir(parents=True, exist_ok=True)
    if sdist.exists():
        log(f"{sdist} fails its checksum; downloading it again")
        sdist.unlink()
    log(f"downloading {SDIST_NAME}=={SDIST_VERSION} (sdist, {SDIST_SIZE / 1e6:.0f} MB) through pip")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
        "--disable-pip-version-check", "-d", str(dl_dir), f"{SDIST_NAME}=={SDIST_VERSION}",
    ]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    digest = sha256_of(sdist) if sdist.is_file() else "<missing>"
    if digest != SDIST_SHA256:
        raise SystemExit(
            f"checksum mismatch for {sdist}: got {digest}, expected {SDIST_SHA256}; refusing to build"
        )
    return sdist


def patch_files(patches_dir: Path | None) -> list[Path]:
    if patches_dir is None or not patches_dir.is_dir():
        return []
    return sorted(patches_dir.glob("*.patch"))


def tree_key(patches: list[Path]) -> str:
    h = hashlib.sha256(SDIST_SHA256.encode())
    for p in patches:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def extract(sdist: Path, dest: Path) -> None:
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(TREE_PREFIX):
                continue
            rel = m.name[len(TREE_PREFIX):]
            if not rel or rel == ".git" or rel.startswith(".git/"):
                continue  # a dangling gitlink in the sdist: noise for git and CMake
            m.name = rel
            members.append(m)
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **kwargs)


def apply_patches(tree: Path, patches: list[Path]) -> None:
    for p in patches:
        log(f"applying {p.name}")
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(p)], cwd=tree, check=True,
                       stdout=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--patches", type=Path, default=Path(__file__).resolve().parent.parent / "patches")
    args = ap.parse_args()

    cache = (args.cache_dir or default_cache_dir()).expanduser().resolve()
    patches = patch_files(args.patches)
    tree = cache / f"llama.cpp-{LLAMA_CPP_COMMIT}-{tree_key(patches)}"
    marker = tree / ".llamaspec-ready"
    if marker.is_file():
        print(tree)
        return 0

    sdist = obtain_sdist(cache / "dl")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="llama.cpp-", dir=cache))
    try:
        log(f"extracting llama.cpp {LLAMA_CPP_COMMIT} into {tree}")
        extract(sdist, tmp)
        apply_patches(tmp, patches)
        (tmp / ".llamaspec-ready").write_text(
            f"{SDIST_FILE} sha256={SDIST_SHA256}\npatches={[p.name for p in patches]}\n"
        )
        if tree.exists():
            shutil.rmtree(tree)
        tmp.rename(tree)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
