"""The real SmolLM2-135M-Instruct Q4_1 model: a quantized model through the default build."""

from __future__ import annotations

import pytest

import llamaspec
from llamaspec import Done, EndOfGeneration, Token

pytestmark = pytest.mark.real_model

CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one short sentence."}]


def test_properties(smol: llamaspec.Model) -> None:
    assert smol.architecture == "llama"
    assert smol.n_vocab == 49152 and smol.n_layer == 30
    assert 130_000_000 < smol.n_params < 140_000_000
    assert smol.size > 50_000_000 and smol.n_ctx_train >= 2048 and smol.n_embd == 576
    assert not smol.has_mtp and smol.n_layer_nextn == 0
    assert "Q4_1" in smol.description
    assert smol.chat_template and "im_start" in smol.chat_template
    assert smol.metadata["general.architecture"] == "llama"
    assert smol.bos is not None and smol.eos is not None and smol.is_eog(smol.eos)


def test_tokenizer_round_trip(smol: llamaspec.Model) -> None:
    text = "Hello, world! Ünïcödé and 日本語 ✓"
    ids = smol.tokenize(text, add_special=False)
    assert smol.detokenize(ids) == text
    assert b"".join(smol.token_to_piece(i) for i in ids).decode() == text
    assert smol.tokenize("<|im_start|>", add_special=False, parse_special=True) != smol.tokenize(
        "<|im_start|>", add_special=False, parse_special=False)


def test_quantized_model_generates_deterministically(smol: llamaspec.Model) -> None:
    # Q4_1 through the default build: the AMX crash would kill the process here (docs/adr/0003).
    with llamaspec.Generator(smol) as g:
        a = g.generate("The capital of France is", 24, temperature=0)
        b = g.generate("The capital of France is", 24, temperature=0)
    assert a == b and "Paris" in a


def test_stream_equals_generate_and_detokenize(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol) as g:
        events = list(g.stream_events("Once upon a time", 48, temperature=0))
        text = g.generate("Once upon a time", 48, temperature=0)
    tokens = [e for e in events if isinstance(e, Token)]
    assert "".join(t.text for t in tokens) == text
    assert smol.detokenize([t.id for t in tokens]) == text
    assert len(tokens) == 48 and isinstance(events[-1], Done)


def test_chat_template_renders_and_model_stops_by_itself(smol: llamaspec.Model) -> None:
    prompt = smol.apply_chat_template(CHAT)
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
    assert "capital of France" in prompt
    with llamaspec.Generator(smol) as g:
        events = list(g.stream_events(prompt, 200, temperature=0))
    assert isinstance(events[-2], EndOfGeneration) and isinstance(events[-1], Done)
    stats = events[-1].stats
    assert stats.finish_reason == "stop" and stats.tokens < 200
    assert stats.tokens == sum(isinstance(e, Token) for e in events)  # EOG neither emitted nor counted
    assert "Paris" in "".join(e.text for e in events if isinstance(e, Token))


def test_multibyte_text_streams_as_valid_utf8(smol: llamaspec.Model) -> None:
    prompt = smol.apply_chat_template([{"role": "user", "content": 'Translate "good morning" into Japanese:'}])
    with llamaspec.Generator(smol) as g:
        events = list(g.stream_events(prompt, 60, temperature=0))
    tokens = [e for e in events if isinstance(e, Token)]
    pieces = [t.text for t in tokens]
    assert any(ord(ch) > 0x3000 for p in pieces for ch in p)  # Japanese text came out
    assert "" in pieces  # some pieces were held back mid-character ...
    for p in pieces:
        p.encode("utf-8")  # ... and every piece is valid UTF-8 on its own
    assert "".join(pieces) == smol.detokenize([t.id for t in tokens])


def test_stop_strings_end_generation_exactly(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol) as g:
        full = g.generate("The capital of France is", 40, temperature=0)
        cut = full.index("\n") if "\n" in full else len(full) // 2
        stop = full[cut: cut + 2]
        text = g.generate("The capital of France is", 40, temperature=0, stop=[stop])
        assert text == full[: full.index(stop)]
        assert g.last_stats is not None and g.last_stats.finish_reason == "stop"
        pieces = list(g.stream("The capital of France is", 40, temperature=0, stop=stop))
        assert "".join(pieces) == text


def test_seeded_sampling_is_reproducible(smol: llamaspec.Model) -> None:
    with llamaspec.Generator(smol) as g:
        a = g.generate("Tell me a story about a cat.", 32, temperature=0.9, seed=7)
        b = g.generate("Tell me a story about a cat.", 32, temperature=0.9, seed=7)
    assert a == b


def test_grammar_on_real_model(smol: llamaspec.Model) -> None:
    prompt = smol.apply_chat_template([{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
    with llamaspec.Generator(smol) as g:
        text = g.generate(prompt, 8, temperature=0, grammar='root ::= ("yes" | "no") "."')
    assert text in ("yes.", "no.")
