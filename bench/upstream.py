"""Shared bench helpers: build upstream llama.cpp tools (llama-completion, later llama-server, ...) for benchmarks.

They are built bench-only from the SAME pinned, patched tree that llamaspec builds against
(cmake/fetch_llama_cpp.py) and with the same CPU settings as our extension: GGML_NATIVE (ggml's
default), the AMX extensions switched off (docs/adr/0003), GGML_OPENMP=OFF, static libraries,
Release. The build lives in build/bench-upstream/<tree>/ (ignored by git), one per patched tree (a
new patch set gets a new build), and is reused. UPSTREAM_CMAKE_ARGS (e.g. "-DGGML_CUDA=on
-DCMAKE_CUDA_ARCHITECTURES=90", scripts/gpu_check.sh) adds CMake arguments, in a build of its own.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import socket
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "bench-upstream"
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def llama_cpp_tree() -> Path:
    out = subprocess.run([sys.executable, str(ROOT / "cmake" / "fetch_llama_cpp.py")], check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(out)


def build_tools(*targets: str) -> Path:
    """Configure (once) and build the given upstream targets; returns the bin directory."""
    src = llama_cpp_tree()
    extra = shlex.split(os.environ.get("UPSTREAM_CMAKE_ARGS", ""))
    build = BUILD / src.name  # the tree's name carries the commit and the patch set
    if extra:
        build = build.with_name(build.name + "-" + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:8])
    if not (build / "build.ninja").exists():
        build.mkdir(parents=True, exist_ok=True)
        args = [
            "cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_OPENSSL=OFF", "-DGGML_RPC=ON", "-DGGML_RPC_RDMA=OFF",
            f"-DCMAKE_C_FLAGS={AMX_OFF}", f"-DCMAKE_CXX_FLAGS={AMX_OFF}", *extra,
        ]
        if shutil.which("ccache"):
            args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", *targets], check=True, stdout=subprocess.DEVNULL)
    return build / "bin"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(cmd: list[str], port: int, timeout: float = 120.0) -> Iterator[str]:
    """Run a server command (llama-server or `llamaspec serve`) until its /health answers 200; yields
    its URL and stops it at the end."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{Path(cmd[0]).name} did not start ({proc.returncode})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


RESULTS = ROOT / "bench" / "results"


def save_report(name: str, report: str) -> Path:
    """Write bench/results/<name>-<stamp>.md with the command line that produced it."""
    import llamaspec

    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = RESULTS / f"{name}-{stamp}.md"
    cmd = f"python bench/{name}.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out.write_text(f"# {name} {stamp}\n\ncommand: `{cmd}`\n\nmachine: {platform.machine()}, "
                   f"{platform.processor() or 'cpu'}, llamaspec {llamaspec.__version__}\n\n"
                   f"system_info: `{llamaspec.system_info()}`\n\n{report}\n")
    return out


def emit_report(name: str, lines: list[str], save: bool) -> None:
    """Print the report and, with ``save``, keep it in bench/results/ (save_report)."""
    report = "\n".join(lines)
    print()
    print(report)
    if save:
        print(f"\nsaved {save_report(name, report)}")


def timed(main: Callable[[], None]) -> None:
    """Run a bench's main() and print how long it took."""
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
