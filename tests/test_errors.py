"""Every typed error has a test: the class, its bases, and what it carries."""

from __future__ import annotations

import threading
from pathlib import Path

import gguf
import pytest
from llamaspec_fixtures import FixtureInfo

import llamaspec
from llamaspec import (
    BusyError,
    ChatTemplateError,
    ClosedError,
    ContextOverflowError,
    DecodeError,
    GenerationTimeout,
    GrammarError,
    InvalidOptionError,
    LlamaspecError,
    LoadCancelledError,
    ModelLoadError,
    UnsupportedModelError,
)



@pytest.mark.unit
def test_hierarchy() -> None:
    for name in llamaspec.errors.__all__:  # every class, each exported by the package too
        assert issubclass(getattr(llamaspec.errors, name), LlamaspecError)
        assert name in llamaspec.__all__ and getattr(llamaspec, name) is getattr(llamaspec.errors, name)
    assert issubclass(GenerationTimeout, TimeoutError)
    assert issubclass(InvalidOptionError, ValueError)
    assert issubclass(GrammarError, InvalidOptionError)
    assert issubclass(LoadCancelledError, ModelLoadError)
    e = DecodeError("x", code=3, path="p")
    assert (e.code, e.path, str(e)) == (3, "p", "x")


# -- load progress and LoadCancelledError -----------------------------------------------------------

def test_load_progress_is_reported_and_can_cancel(fx_info: FixtureInfo) -> None:
    seen: list[float] = []
    with llamaspec.Model(fx_info.path, progress=seen.append) as m:  # None: go on
        n_layer = m.n_layer
    assert len(seen) > 2 and seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)

    with pytest.raises(LoadCancelledError, match="cancelled") as ei:
        llamaspec.Model(fx_info.path, progress=lambda share: share < 0.5)
    assert ei.value.path == fx_info.path

    class Stop(Exception):
        pass

    def raises(share: float) -> bool:
        raise Stop("from the callback")

    with pytest.raises(Stop, match="from the callback"):
        llamaspec.Model(fx_info.path, progress=raises)
    with pytest.raises(InvalidOptionError, match="progress"):
        llamaspec.Model(fx_info.path, progress=42)  # type: ignore[arg-type]
    with llamaspec.Model(fx_info.path) as again:  # nothing was left half-loaded
        assert again.n_layer == n_layer > 0


# -- ModelLoadError: each names the path ------------------------------------------------------------

@pytest.mark.unit
def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="not found") as ei:
        llamaspec.Model(p)
    assert ei.value.path == str(p) and str(p) in str(ei.value)


@pytest.mark.unit
def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="directory") as ei:
        llamaspec.Model(tmp_path)
    assert str(tmp_path) in str(ei.value)


@pytest.mark.unit
def test_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 definitely a zip file" * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF") as ei:
        llamaspec.Model(p)
    assert str(p) in str(ei.value)


@pytest.mark.fixture
@pytest.mark.parametrize("keep", [0.02, 0.5, 0.97])
def test_truncated(tmp_path: Path, fx_info, keep: float) -> None:
    data = Path(fx_info.path).read_bytes()
    p = tmp_path / f"truncated-{keep}.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelLoadError) as ei:
        llamaspec.Model(p)
    assert str(p) in str(ei.value)
    assert ei.value.path == str(p)


@pytest.mark.unit
def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        llamaspec.Model(p)


# -- UnsupportedModelError ------------------------------------------------------------------------

@pytest.mark.unit
def test_unknown_architecture(tmp_path: Path) -> None:
    p = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(p), "alien-arch-9000")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 32), dtype="float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="alien-arch-9000") as ei:
        llamaspec.Model(p)
    assert ei.value.path == str(p)


# -- options --------------------------------------------------------------------------------------

@pytest.mark.fixture
def test_unknown_context_option_is_type_error(fx: llamaspec.Model) -> None:
    with pytest.raises(TypeError, match="n_ctxx"):
        llamaspec.Generator(fx, n_ctxx=128)


@pytest.mark.parametrize(
    "opts",
    [{"n_ctx": -1}, {"n_ctx": "big"}, {"n_threads": 0}, {"n_batch": 0}, {"type_k": "q3_z"},
     {"flash_attn": "maybe"}, {"n_ubatch": 1024, "n_batch": 512}, {"rope_freq_base": float("nan")},
     {"offload_kqv": 1}, {"attention_type": "sideways"}],
)
@pytest.mark.fixture
def test_invalid_context_option(fx: llamaspec.Model, opts: dict) -> None:
    with pytest.raises(InvalidOptionError):
        llamaspec.Generator(fx, **opts)


@pytest.mark.parametrize(
    "opts",
    [{"temperature": "hot"}, {"top_p": 1.5}, {"min_p": -0.1}, {"seed": -1}, {"repeat_penalty": 0},
     {"stop": [""]}, {"stop": [1]}, {"logit_bias": {5: "x"}}, {"mirostat": 3}, {"penalty_last_n": -2}],
)
@pytest.mark.fixture
def test_invalid_sampling_option(fx: llamaspec.Model, opts: dict) -> None:
    with llamaspec.Generator(fx, n_ctx=128) as g:
        with pytest.raises(InvalidOptionError):
            g.stream("hi", 4, **opts)  # raised at the call, before anything native runs


@pytest.mark.fixture
def test_unknown_sampling_option_is_type_error(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=128) as g, pytest.raises(TypeError, match="temprature"):
        g.generate("hi", 4, temprature=0.0)


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"max_tokens": 2.5}, {"timeout": -1}, {"prompt": []},
                                 {"prompt": [1, "a"]}, {"prompt": b"bytes"}, {"prompt": [10_000]}])
@pytest.mark.fixture
def test_invalid_call_arguments(fx: llamaspec.Model, bad: dict) -> None:
    args = {"prompt": "hi", "max_tokens": 4, **bad}
    with llamaspec.Generator(fx, n_ctx=128) as g, pytest.raises(InvalidOptionError):
        g.generate(**args)


@pytest.mark.fixture
def test_invalid_model_options(fx_info) -> None:
    with pytest.raises(InvalidOptionError):
        llamaspec.Model(fx_info.path, split_mode="diagonal")
    with pytest.raises(InvalidOptionError):
        llamaspec.Model(fx_info.path, use_mmap="yes")  # type: ignore[arg-type]


@pytest.mark.fixture
def test_token_out_of_range(fx: llamaspec.Model) -> None:
    with pytest.raises(InvalidOptionError, match="out of range"):
        fx.detokenize([fx.n_vocab])
    with pytest.raises(InvalidOptionError):
        fx.token_to_piece(-1)


# -- generation errors ----------------------------------------------------------------------------

@pytest.mark.fixture
def test_context_overflow_before_decoding(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=64) as g:
        n_ctx = g.n_ctx  # llama.cpp may round the requested size up
        with pytest.raises(ContextOverflowError, match=f"n_ctx={n_ctx}"):
            g.generate("x" * (n_ctx - 20), max_tokens=21)
        assert g.last_stats is None  # nothing was decoded
        assert len(g.generate("x" * 10, max_tokens=30, temperature=0)) > 0  # still usable


@pytest.mark.fixture
def test_grammar_error_names_the_problem(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=128) as g:
        with pytest.raises(GrammarError, match="unexpected end of input") as ei:
            g.generate("hi", 4, grammar='root ::= "a" "')
        assert isinstance(ei.value, ValueError)
        with pytest.raises(GrammarError, match="Undefined rule identifier 'missing-rule'"):
            g.generate("hi", 4, grammar="root ::= missing-rule")
        with pytest.raises(GrammarError, match="root"):
            g.generate("hi", 4, grammar='start ::= "a"')  # no root rule
        assert g.generate("hi", 3, temperature=0)  # reusable


@pytest.mark.fixture
def test_chat_template_error(fx: llamaspec.Model) -> None:
    with pytest.raises(ChatTemplateError):
        fx.apply_chat_template([{"role": "user", "content": "hi"}], chat_template="{% for x in %}")


@pytest.mark.fixture
def test_busy_error(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=512, n_threads=1) as g:
        it = g.stream_events("abc", 400)
        next(it)  # running now
        with pytest.raises(BusyError):
            g.generate("abc", 4)
        it.close()
        assert g.generate("abc", 4)  # free again


@pytest.mark.fixture
def test_generation_timeout_stops_native_work(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=8192, n_threads=1) as g:
        with pytest.raises(GenerationTimeout) as ei:
            # every token after the first must come within 1 microsecond: it cannot
            for _ in g.stream("abc", 8000, timeout=1e-6):
                pass
        assert isinstance(ei.value, TimeoutError)
        assert not g.busy
        assert len(g.generate("abc", 8, temperature=0)) == 8


@pytest.mark.real_model
def test_prefill_timeout(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol, n_ctx=2048) as g:
        long_prompt = "word " * 1500
        with pytest.raises(GenerationTimeout, match="prompt"):
            g.generate(long_prompt, 4, prefill_timeout=0.01)
        assert g.generate("Hi", 2, temperature=0)


@pytest.mark.fixture
def test_decode_error_carries_code(fx: llamaspec.Model) -> None:
    with llamaspec.Context(fx, n_ctx=64, n_threads=1) as c:
        c.decode([1, 2, 3], 0)
        with pytest.raises(DecodeError) as ei:
            c.decode([4], 0)  # position 0 again: inconsistent sequence positions
        assert ei.value.code is not None and ei.value.code != 0
        c.clear()
        c.decode([1, 2, 3], 0)


@pytest.mark.fixture
def test_closed_errors(fx_info) -> None:
    m = llamaspec.Model(fx_info.path)
    g = llamaspec.Generator(m, n_ctx=64, n_threads=1)
    m.close()
    with pytest.raises(ClosedError):
        m.tokenize("x")
    # the generator keeps the weights alive
    assert len(g.generate([65], 4, temperature=0)) == 4
    g.close()
    with pytest.raises(ClosedError):
        g.generate("x", 2)


@pytest.mark.fixture
def test_errors_from_threads_do_not_abort(fx: llamaspec.Model) -> None:
    errors: list[BaseException] = []

    def bad() -> None:
        try:
            with llamaspec.Generator(fx, n_ctx=32, n_threads=1) as g:
                g.generate("x" * g.n_ctx, 10)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=bad) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(errors) == 4 and all(isinstance(e, ContextOverflowError) for e in errors)
