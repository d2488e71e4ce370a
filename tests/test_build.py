"""What the build must guarantee: the CPU crash fix, hidden symbols, stubs, the package face, and no
test helpers in the product."""

from __future__ import annotations

import importlib.resources
import importlib.util
import subprocess
import sys

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
    assert "class Run" in text and "def system_info" in text
    assert "class Session" in text and "def ngram_cache_create" in text


def test_public_names() -> None:
    for name in llamaspec.__all__:
        assert hasattr(llamaspec, name), name
    assert llamaspec.__version__


FIXTURE_MODULES = ["llamaspec_fixtures", "llamaspec_fixtures._common", "llamaspec_fixtures.qwen35",
                   "llamaspec_fixtures.drafters"]


@pytest.mark.parametrize("module", FIXTURE_MODULES)
def test_fixture_writers_live_outside_the_product(module: str) -> None:
    # the GGUF fixture writers are the separate fixtures/ package (llamaspec-fixtures), not in the wheel
    assert importlib.util.find_spec("llamaspec.fixtures") is None
    assert importlib.util.find_spec("llamaspec._drafter_fixtures") is None
    # each module imports first in a fresh interpreter (no import cycle), without importing llamaspec
    code = f"import sys, {module}; assert 'llamaspec' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
