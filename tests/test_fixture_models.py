"""Plain generation on the generated qwen35 fixtures, whose greedy output is known by construction."""

from __future__ import annotations

import gguf
import pytest

import llamaspec
from llamaspec import Done, EndOfGeneration, Token
from llamaspec_fixtures import FixtureInfo

pytestmark = pytest.mark.fixture

PROMPTS = ["hello", "The quick brown fox", "~", "0123456789"]


@pytest.mark.parametrize("which", ["fx_info", "fx_nomtp_info", "fx_q8_info", "fx_nomtp_q8_info"])
def test_greedy_output_is_the_stored_cycle(request: pytest.FixtureRequest, which: str) -> None:
    info: FixtureInfo = request.getfixturevalue(which)
    # the file itself carries next(x); check generation against what is stored, not what we meant
    reader = gguf.GGUFReader(info.path)
    field = reader.get_field("llamaspec.fixture.next")
    assert field is not None
    stored_next = [int(field.parts[i][0]) for i in field.data]
    assert stored_next == info.next_map
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=512, n_threads=1) as g:
        assert m.architecture == "qwen35"
        assert m.has_mtp == info.mtp and m.n_layer_nextn == (1 if info.mtp else 0)
        for prompt in PROMPTS:
            ids = [e.id for e in g.stream_events(prompt, 120, temperature=0.0) if isinstance(e, Token)]
            expected, x = [], m.tokenize(prompt)[-1]
            for _ in range(120):
                x = stored_next[x]
                expected.append(x)
            assert ids == expected, prompt
            assert set(ids) <= set(info.cycle)  # after one step the output stays on the printable cycle


def test_fixture_metadata_and_tokenizer(fx: llamaspec.Model, fx_info: FixtureInfo) -> None:
    assert fx.n_vocab == 260
    assert fx.n_layer == 4 and fx.n_layer_nextn == 1 and fx.has_mtp and fx.mtp_loaded
    assert fx.architecture == "qwen35"
    assert fx.bos == 257 and fx.eos == 257 and fx.is_eog(257) and not fx.is_eog(65)
    # the one merge ("ĠĠ"); the pre-tokenizer leaves the last space to the word
    assert fx.tokenize("hi   there") == [ord("h"), ord("i"), 256, 32, *map(ord, "there")]
    assert fx.detokenize(fx.tokenize("hi   there")) == "hi   there"
    assert fx.token_to_piece(ord("A")) == b"A"
    assert fx.tokenize("<|im_start|>", parse_special=True) == [258]
    meta = fx.metadata
    assert meta["general.architecture"] == "qwen35" and meta["llamaspec.fixture.seed"] == "1234"


def test_events_order_and_counts(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        events = list(g.stream_events("abc", 17, temperature=0))
    assert all(isinstance(e, Token) for e in events[:-1])
    assert isinstance(events[-1], Done)
    st = events[-1].stats
    assert st.tokens == 17 and st.finish_reason == "length" and st.prompt_tokens == 3
    assert st.prefill_time > 0 and st.time_to_first_token >= st.prefill_time
    assert st.total_time >= st.time_to_first_token and st.tokens_per_second > 0
    assert not any(isinstance(e, EndOfGeneration) for e in events)


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 64])
def test_max_tokens_is_exact(fx: llamaspec.Model, max_tokens: int) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        text = g.generate("xyz", max_tokens, temperature=0)
        assert len(text) == max_tokens and g.last_stats is not None and g.last_stats.tokens == max_tokens


def test_stream_equals_generate_and_token_list_prompt(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        a = "".join(g.stream("start", 50, temperature=0))
        b = g.generate("start", 50, temperature=0)
        c = g.generate(fx.tokenize("start"), 50, temperature=0)
    assert a == b == c and len(a) == 50


def test_sampled_output_is_reproducible_with_seed(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        a = g.generate("q", 40, temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
        assert g.last_stats is not None and g.last_stats.seed == 42
        b = g.generate("q", 40, temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
        c = g.generate("q", 40, temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=43)
        g.generate("q", 4, temperature=1.0)
        assert g.last_stats is not None and 0 <= g.last_stats.seed < 2**32 - 1  # a random one was reported
    assert a == b and a != c


def test_grammar_constrains_output(fx: llamaspec.Model) -> None:
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        text = g.generate("hello", 30, temperature=0, grammar='root ::= [0-9]+ "!"')
        assert text[:-1].isdigit() or (text.isdigit() and len(text) == 30)
        text = g.generate("hello", 30, temperature=0, grammar='digits ::= [a-c]+', grammar_root="digits")
        assert set(text) <= set("abc") and text


def test_stop_string_is_exact(fx: llamaspec.Model, fx_info: FixtureInfo) -> None:
    greedy = fx.detokenize(fx_info.greedy(fx.tokenize("hello")[-1], 60))
    stop = greedy[20:23]
    with llamaspec.Generator(fx, n_ctx=256, n_threads=1) as g:
        text = g.generate("hello", 60, temperature=0, stop=[stop, "never-appears"])
        assert text == greedy[: greedy.index(stop)]
        assert g.last_stats is not None and g.last_stats.finish_reason == "stop"
        assert g.last_stats.tokens == 23  # the tokens of the stop text were generated, not emitted


def test_chat_template_of_fixture(fx: llamaspec.Model) -> None:
    out = fx.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert fx.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False).endswith(
        "<|im_end|>\n")


def test_enable_thinking_and_template_kwargs_reach_the_template(fx: llamaspec.Model) -> None:
    tmpl = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
            "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}"
            "{% if greeting is defined %}[{{ greeting }}]{% endif %}")
    msgs = [{"role": "user", "content": "Q"}]
    assert fx.apply_chat_template(msgs, chat_template=tmpl) == "Q"
    assert fx.apply_chat_template(msgs, chat_template=tmpl, enable_thinking=False) == "Q[no-think]"
    assert fx.apply_chat_template(msgs, chat_template=tmpl, greeting="hey") == "Q[hey]"


def test_low_level_context_logits_match_greedy(fx: llamaspec.Model, fx_info: FixtureInfo) -> None:
    with llamaspec.Context(fx, n_ctx=128, n_threads=1) as c:
        assert c.n_ctx >= 128 and c.n_threads == 1
        c.decode(fx.tokenize("hello"))
        logits = c.logits()
        assert logits.shape == (fx.n_vocab,)
        assert int(logits.argmax()) == fx_info.next_map[ord("o")]
