"""What the build must guarantee: the CPU crash fix, hidden symbols, stubs, and the package face."""

from __future__ import annotations

import importlib.resources
import subprocess

import pytest

import llamaspec
from llamaspec import _native

pytestmark = pytest.mark.unit


def test_no_amx_kernels_compiled() -> None:
    # docs/adr/0003: with AMX compiled in, every quantized model segfaults on AMX-capable Xeons.
    info = llamaspec.system_info()
    assert "CPU" in info
    assert "AMX" not in info, info


def test_extension_exports_few_symbols() -> None:
    so = _native.__file__
    out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert any(n.startswith("PyInit__native") for n in names)
    assert not [n for n in names if n.startswith(("llama_", "ggml_", "gguf_", "_ZN7httplib"))]
    assert len(names) < 10, names  # only the init function (src/native/exports.map)


def test_package_ships_types() -> None:
    files = importlib.resources.files("llamaspec")
    assert files.joinpath("py.typed").is_file()
    stub = files.joinpath("_native.pyi")
    assert stub.is_file()
    text = stub.read_text()
    assert "class Generator" in text and "class Run" in text and "def system_info" in text
    assert "class SpecSession" in text and "def ngram_cache_create" in text


def test_public_names() -> None:
    for name in llamaspec.__all__:
        assert hasattr(llamaspec, name), name
    assert llamaspec.__version__
