"""Upstream llama.cpp tools as test oracles, built from the same pinned tree and the same static
libraries the extension was built with (build/<wheel tag>/llama.cpp): one source file compiled and
linked, a second or two. Test helpers only: nothing here ships in the package."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBS = [
    "common/libllama-common.a",
    "common/libllama-common-base.a",
    "vendor/cpp-httplib/libcpp-httplib.a",
    "src/libllama.a",
    "ggml/src/libggml.a",
    "ggml/src/libggml-cpu.a",
    "ggml/src/ggml-rpc/libggml-rpc.a",  # the build has the RPC backend (ADR 0029)
    "ggml/src/libggml-base.a",
]


def pinned_tree() -> Path:
    out = subprocess.run([sys.executable, str(ROOT / "cmake" / "fetch_llama_cpp.py")], check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out)


def _build_dir() -> Path:
    """The extension's CMake build tree (pyproject.toml: build-dir = "build/{wheel_tag}")."""
    for d in sorted((ROOT / "build").glob("cp*/llama.cpp")):
        if all((d / lib).exists() for lib in LIBS):
            return d
    raise RuntimeError("no extension build tree with llama.cpp's static libraries under build/ "
                       f"(python {sysconfig.get_python_version()}): run the README's test command")


def upstream_tool(name: str, source: str) -> Path:
    """Build (once per library change) upstream's example `source` (relative to the tree) as `name`."""
    tree, libs = pinned_tree(), _build_dir()
    exe = ROOT / "build" / "oracles" / name
    inputs = [tree / source, *(libs / lib for lib in LIBS)]
    if exe.exists() and exe.stat().st_mtime >= max(p.stat().st_mtime for p in inputs):
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["g++", "-O2", "-std=c++17", f"-I{tree / 'include'}", f"-I{tree / 'common'}",
           f"-I{tree / 'ggml' / 'include'}", str(tree / source), "-o", str(exe),
           *(str(libs / lib) for lib in LIBS), "-lpthread", "-ldl"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    return exe


def llama_embedding() -> Path:
    """llama.cpp's llama-embedding (examples/embedding)."""
    return upstream_tool("llama-embedding", "examples/embedding/embedding.cpp")
