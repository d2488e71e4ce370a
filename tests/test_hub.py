"""Models by name (Model.from_pretrained, -hf) against a Hugging Face Hub cache this test fills
itself, offline (HF_HUB_OFFLINE=1: these machines reach no Hub). huggingface_hub reads its
environment when imported, so everything runs in a subprocess, as a user's program would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llamaspec_fixtures import FixtureInfo

import llamaspec
from llamaspec._hub import choose
from llamaspec.errors import ModelLoadError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "llamaspec/tiny-qwen35"


@pytest.fixture
def hub(tmp_path: Path, fx_info: FixtureInfo, fx_q8_info: FixtureInfo) -> dict[str, str]:
    """A Hub cache holding REPO at main: the fixture in F16 and Q8_0, and a projector file; the
    environment that makes huggingface_hub use it, offline."""
    cache = tmp_path / "hub"
    repo = cache / ("models--" + REPO.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.copy(fx_info.path, snap / "tiny-qwen35-F16.gguf")
    shutil.copy(fx_q8_info.path, snap / "tiny-qwen35-Q8_0.gguf")
    shutil.copy(fx_info.path, snap / "mmproj-tiny-qwen35-F16.gguf")
    (snap / "README.md").write_text("a model card\n")
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf")}


def py(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_from_pretrained_picks_by_tag_glob_and_default(hub: dict[str, str], fx_info: FixtureInfo) -> None:
    r = py(f"""
import json, llamaspec
out = {{}}
for key, args, kw in [("tag", ("{REPO}:q8_0",), {{}}), ("quant", ("{REPO}",), {{"quant": "F16"}}),
                      ("glob", ("{REPO}", "*F16.gguf"), {{}}), ("default", ("{REPO}",), {{}})]:
    with llamaspec.Model.from_pretrained(*args, **kw) as m:
        out[key] = [m.path.rsplit("/", 1)[1], m.n_layer]
try:
    llamaspec.Model.from_pretrained("{REPO}:Q2_K")
except llamaspec.ModelLoadError as e:
    out["no match"] = str(e)
try:
    llamaspec.Model.from_pretrained("llamaspec/not-cached")
except llamaspec.ModelLoadError as e:
    out["not cached"] = str(e)
try:
    llamaspec.Model.from_pretrained("{REPO}:Q8_0", "*.gguf")
except llamaspec.InvalidOptionError as e:
    out["twice"] = str(e)
print(json.dumps(out))
""", hub)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    n_layer = fx_info.spec.n_trunk
    assert out["tag"] == ["tiny-qwen35-Q8_0.gguf", n_layer]
    assert out["quant"] == out["glob"] == ["tiny-qwen35-F16.gguf", n_layer]
    assert out["default"] == ["tiny-qwen35-F16.gguf", n_layer]  # no Q4_K_M: the first by name, no mmproj
    assert "no GGUF file with 'Q2_K'" in out["no match"] and "tiny-qwen35-Q8_0.gguf" in out["no match"]
    assert "llamaspec/not-cached" in out["not cached"] and "offline" in out["not cached"]
    assert "give the quantization once" in out["twice"]


def test_run_and_info_take_a_model_by_name(hub: dict[str, str], fx_info: FixtureInfo) -> None:
    with llamaspec.Model(fx_info.path, vocab_only=True) as vm:
        prompt = vm.detokenize(fx_info.cycle[:8])
    with llamaspec.Model(fx_info.path) as m, llamaspec.Generator(m, n_ctx=512) as g:
        want = g.generate(prompt, 16, temperature=0)
    run = [sys.executable, "-m", "llamaspec", "run", "-hf", f"{REPO}:F16", "--raw", "-p", prompt, "-n", "16",
           "--temp", "0", "-c", "512"]
    r = subprocess.run(run, capture_output=True, text=True, env=hub, timeout=120)
    assert r.returncode == 0 and r.stdout == want, r.stderr
    r = subprocess.run([sys.executable, "-m", "llamaspec", "info", "-hf", REPO, "-hff", "*Q8_0.gguf",
                        "--json"], capture_output=True, text=True, env=hub, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"].endswith("/snapshots/" + COMMIT + "/tiny-qwen35-Q8_0.gguf")
    bad = subprocess.run([sys.executable, "-m", "llamaspec", "run", "-hf", "llamaspec/not-cached", "-p", "x"],
                         capture_output=True, text=True, env=hub, timeout=120)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert "llamaspec/not-cached" in bad.stderr
    for args in (["run", fx_info.path, "-hf", REPO, "-p", "x"],
                 ["run", "-hff", "x.gguf", fx_info.path, "-p", "x"],
                 ["run", "-hf", f"{REPO}:F16", "-hff", "*.gguf", "-p", "x"],
                 ["run", "-hf", "llamaspec/not-cached", "-p", "x", "-n", "0"]):  # usage errors come first
        usage = subprocess.run([sys.executable, "-m", "llamaspec", *args], capture_output=True, text=True,
                               env=hub, timeout=120)
        assert usage.returncode == 2 and "Traceback" not in usage.stderr, usage.stderr


def test_without_huggingface_hub_the_error_says_what_to_install(hub: dict[str, str]) -> None:
    r = py(f"""
import sys
sys.modules["huggingface_hub"] = None  # as if it were not installed
import llamaspec
try:
    llamaspec.Model.from_pretrained("{REPO}")
except llamaspec.ModelLoadError as e:
    print(e)
""", hub)
    assert r.returncode == 0 and "pip install 'llamaspec[hub]'" in r.stdout, r.stderr


def test_choose_prefers_q4_k_m_and_takes_every_part_of_a_split_model() -> None:
    names = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-F16.gguf",
             "big/m-Q4_K_M-00002-of-00003.gguf", "big/m-Q4_K_M-00001-of-00003.gguf",
             "big/m-Q4_K_M-00003-of-00003.gguf"]
    assert choose(names, None, None, "r") == [f"big/m-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert choose(names, "m-Q4_K_M.gguf", None, "r") == ["m-Q4_K_M.gguf"]
    assert choose(names, None, "q8_0", "r") == ["m-Q8_0.gguf"]
    with pytest.raises(ModelLoadError, match="no GGUF file"):
        choose(["mmproj-x.gguf", "README.md"], None, None, "r")
