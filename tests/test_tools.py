"""Tool calls and reasoning (issue 18): Model.chat_prompt renders tools with llama.cpp's chat API and
the real templates of the pinned tree (models/templates/), a session samples with the template's
tool-call grammar and streams the reply parsed; speculation stays lossless under it; misuse is a
typed error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import llamaspec
from llamaspec import (
    ChatMessage,
    ChatTemplateError,
    ContentDelta,
    Done,
    InvalidOptionError,
    ReasoningDelta,
    Speculative,
    Token,
    ToolCallArguments,
    ToolCallStart,
)

from .conftest import WEATHER_TOOL, pinned_templates, token_ids

WEATHER = WEATHER_TOOL
TIME: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a timezone",
                 "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# What each template's model writes for get_weather(location="Paris"), in its own format.
QWEN_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
LLAMA_CALL = '{"name": "get_weather", "parameters": {"location": "Paris"}}'
CALLS = {
    "Qwen-Qwen2.5-7B-Instruct":
        "I will check.\n" + QWEN_CALL,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": QWEN_CALL,
    "meta-llama-Llama-3.1-8B-Instruct": '{"type": "function", ' + LLAMA_CALL[1:],
    "meta-llama-Llama-3.2-3B-Instruct": LLAMA_CALL,
    "meta-llama-Llama-3.3-70B-Instruct": LLAMA_CALL,
    "mistralai-Mistral-Nemo-Instruct-2407":
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Paris"}, "id": "123456789"}]',
    "meetkai-functionary-medium-v3.2": 'get_weather\n{"location": "Paris"}',
    "Qwen-Qwen3-0.6B": "<think>\nThe user asks about the weather.\n</think>\n\n" + QWEN_CALL,
}


@pytest.fixture(scope="module")
def templates() -> Path:
    return pinned_templates()


def template(templates: Path, name: str) -> str:
    return (templates / f"{name}.jinja").read_text()


def feed(parser: llamaspec.ChatParser, text: str, step: int) -> list[Any]:
    deltas: list[Any] = []
    for i in range(0, len(text), step):
        deltas += parser.feed(text[i:i + step])
    return deltas + parser.finish()


@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_template_renders_tools_and_parses_its_call(smol: llamaspec.Model, templates: Path,
                                                          name: str) -> None:
    """The template's own tool format: the prompt describes the tool (and "required" constrains the
    reply with a grammar naming it; "auto" may or may not, as the template's format allows); the
    model's call in that format
    parses into get_weather({"location": "Paris"}), whole and fed in pieces of 1 and 3 characters;
    streamed, a call's start (id and name) comes before its arguments, whose pieces join into them."""
    prompt = smol.chat_prompt(ASK, tools=[WEATHER], chat_template=template(templates, name))
    assert "get_weather" in prompt.text and prompt.parses_tool_calls and prompt.tokens
    forced = smol.chat_prompt(ASK, tools=[WEATHER], tool_choice="required",
                              chat_template=template(templates, name))
    assert "get_weather" in forced.grammar and not forced.grammar_lazy
    whole = prompt.parser()
    whole.feed(CALLS[name])
    whole.finish()
    for step in (1, 3):
        parser = prompt.parser()
        deltas = feed(parser, CALLS[name], step)
        msg = parser.message
        calls = [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]
        assert calls == [("get_weather", {"location": "Paris"})]
        assert msg.content == whole.message.content
        assert msg.reasoning_content == whole.message.reasoning_content
        starts = [i for i, d in enumerate(deltas) if isinstance(d, ToolCallStart)]
        args = [i for i, d in enumerate(deltas) if isinstance(d, ToolCallArguments)]
        assert len(starts) == 1 and args and starts[0] < args[0]
        start = deltas[starts[0]]
        assert (start.index, start.name, start.id) == (0, "get_weather", msg.tool_calls[0].id) and start.id
        assert "".join(deltas[i].text for i in args) == msg.tool_calls[0].arguments
        assert "".join(d.text for d in deltas if isinstance(d, ContentDelta)) == msg.content
        assert "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) == msg.reasoning_content
    if "CALL_ID" in CALLS[name] or '"id"' in CALLS[name]:
        assert whole.message.tool_calls[0].id == "123456789"  # the model's id is kept
    if name == "Qwen-Qwen2.5-7B-Instruct":
        assert whole.message.content == "I will check.\n"
    if name == "Qwen-Qwen3-0.6B":
        assert whole.message.reasoning_content.strip() == "The user asks about the weather."


@pytest.mark.real_model
def test_tool_choice_shapes_the_grammar(smol: llamaspec.Model, templates: Path) -> None:
    """auto: a lazy grammar that starts at the call's marker (free text stays free); required: the
    grammar applies from the first token; none: the tools are shown but no call is parsed or
    constrained; naming a function offers only that one."""
    qwen = template(templates, "Qwen-Qwen2.5-7B-Instruct")
    auto = smol.chat_prompt(ASK, tools=[WEATHER, TIME], chat_template=qwen)
    assert auto.grammar_lazy and auto.sampling()["grammar_triggers"]
    required = smol.chat_prompt(ASK, tools=[WEATHER, TIME], tool_choice="required", chat_template=qwen)
    assert required.grammar and not required.grammar_lazy
    assert required.sampling()["generation_prompt"] == "<|im_start|>assistant\n"
    none = smol.chat_prompt(ASK, tools=[WEATHER], tool_choice="none", chat_template=qwen)
    assert not none.parses_tool_calls and not none.grammar and "get_weather" in none.text
    named = smol.chat_prompt(ASK, tools=[WEATHER, TIME], chat_template=qwen,
                             tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert "get_time" in named.grammar and "get_weather" not in named.grammar and not named.grammar_lazy
    plain = smol.chat_prompt(ASK)
    assert plain.sampling() == {} and not plain.parses_tool_calls
    assert list(plain.tokens) == smol.apply_chat_template(ASK, tokenize=True)


@pytest.mark.real_model
def test_reasoning_is_apart_from_the_content(smol: llamaspec.Model, templates: Path) -> None:
    """A thinking model's <think> block: reasoning_content and ReasoningDelta events with "auto",
    inline in the content with "none"."""
    qwen3 = template(templates, "Qwen-Qwen3-0.6B")
    text = "<think>\nParis is in France.\n</think>\n\nIt is sunny."
    parser = smol.chat_prompt(ASK, chat_template=qwen3).parser()
    deltas = feed(parser, text, 2)
    assert parser.message == ChatMessage("It is sunny.", "Paris is in France.\n")
    kinds = [type(d) for d in deltas]
    assert ReasoningDelta in kinds and ContentDelta in kinds
    assert kinds.index(ContentDelta) > max(i for i, k in enumerate(kinds) if k is ReasoningDelta)
    inline = smol.chat_prompt(ASK, chat_template=qwen3, reasoning_format="none").parser()
    feed(inline, text, 5)
    assert inline.message.reasoning_content == "" and "<think>" in inline.message.content


def forced_call(model: llamaspec.Model, templates: Path, **kw: Any) -> llamaspec.ChatPrompt:
    """A prompt whose grammar forces a call at once (functionary v3.2 with tool_choice "required")."""
    return model.chat_prompt(ASK, tools=[WEATHER], tool_choice="required",
                             chat_template=template(templates, "meetkai-functionary-medium-v3.2"), **kw)


@pytest.mark.real_model
def test_a_forced_call_streams_as_typed_events(smol: llamaspec.Model, templates: Path) -> None:
    """Generation under the tool grammar: the arguments validate against the tool's schema (checked
    with jsonschema), the events come Token, then the deltas its text completes, and Done carries
    the message; chat() returns the same reply and to_dict() is OpenAI's assistant message."""
    prompt = forced_call(smol, templates)
    with llamaspec.Generator(smol, n_ctx=1024, n_threads=2) as gen:
        events = list(gen.stream_events(prompt, 64, temperature=0))
        again = gen.chat(prompt, 64, temperature=0)
    done = events[-1]
    assert isinstance(done, Done) and done.message is not None and done.stats.finish_reason == "stop"
    msg = done.message
    assert len(msg.tool_calls) == 1 and msg.tool_calls[0].name == "get_weather"
    jsonschema.validate(msg.tool_calls[0].parsed_arguments(), WEATHER["function"]["parameters"])
    assert isinstance(events[0], Token)  # deltas follow the token whose text made them
    first_start = next(i for i, e in enumerate(events) if isinstance(e, ToolCallStart))
    assert isinstance(events[first_start - 1], (Token, ContentDelta))
    args = "".join(e.text for e in events if isinstance(e, ToolCallArguments))
    assert args == msg.tool_calls[0].arguments
    assert [(c.name, c.arguments) for c in again.tool_calls] == [(c.name, c.arguments)
                                                                  for c in msg.tool_calls]
    d = msg.to_dict()
    assert d["role"] == "assistant" and d["content"] is None
    assert d["tool_calls"][0]["type"] == "function"
    assert d["tool_calls"][0]["function"]["name"] == "get_weather"
    # messages= is chat_prompt(messages): a chat call, parsed, with nothing forced
    with llamaspec.Generator(smol, n_ctx=1024, n_threads=2) as gen:
        evs = list(gen.stream_events(messages=ASK, max_tokens=16, temperature=0))
    text = "".join(e.text for e in evs if isinstance(e, Token))
    last = evs[-1]
    assert isinstance(last, Done) and last.message == ChatMessage(text)


@pytest.mark.real_model
def test_speculation_is_lossless_under_the_tool_grammar(smol: llamaspec.Model, smol_path: str,
                                                        templates: Path) -> None:
    """A draft model (the same weights) and an n-gram drafter give plain decoding's tokens and the
    same parsed call, greedy and seeded."""
    prompt = forced_call(smol, templates)
    cases: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 0.8, "seed": 7}]

    def run(session: llamaspec.Generator | Speculative, c: dict[str, Any]) -> tuple[list[int], Any]:
        events = list(session.stream_events(prompt, 48, **c))
        done = events[-1]
        assert isinstance(done, Done) and done.message is not None
        return token_ids(events), [(t.name, t.arguments) for t in done.message.tool_calls]

    with llamaspec.Generator(smol, n_ctx=1024, n_threads=2) as plain:
        want = [run(plain, c) for c in cases]
    assert want[0][1] and want[0][1][0][0] == "get_weather"
    for method, kw in (("draft", {"draft_model": smol_path}), ("ngram-simple", {})):
        with Speculative(smol, method=method, n_draft=4, n_ctx=1024, n_threads=2, **kw) as spec:
            for c, w in zip(cases, want):
                assert run(spec, c) == w, (method, c)
            if method == "draft":
                assert spec.stats().drafts_accepted > 0


def test_mtp_is_lossless_under_the_tool_grammar(fx: llamaspec.Model, templates: Path) -> None:
    """The MTP fixture under a forced call's grammar: MTP's tokens equal plain decoding's."""
    prompt = forced_call(fx, templates)
    with llamaspec.Generator(fx, n_ctx=2048, n_threads=1) as plain:
        want = token_ids(plain.stream_events(prompt, 32, temperature=0))
    with llamaspec.MTP(fx, n_draft=3, n_ctx=2048, n_threads=1) as spec:
        got = token_ids(spec.stream_events(prompt, 32, temperature=0))
        assert spec.stats().drafts_generated > 0
    assert got == want


@pytest.mark.real_model
def test_misuse_is_a_typed_error(smol: llamaspec.Model, templates: Path) -> None:
    qwen = template(templates, "Qwen-Qwen2.5-7B-Instruct")
    with pytest.raises(InvalidOptionError, match="tool_choice must be"):
        smol.chat_prompt(ASK, tools=[WEATHER], tool_choice="sometimes")
    with pytest.raises(InvalidOptionError, match="'required' needs at least one tool"):
        smol.chat_prompt(ASK, tool_choice="required")
    with pytest.raises(InvalidOptionError, match="not among the tools"):
        smol.chat_prompt(ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    for bad in ([{"type": "retrieval"}], "get_weather", [{"type": "function", "function": {}}]):
        with pytest.raises(InvalidOptionError, match="tool"):
            smol.chat_prompt(ASK, tools=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="reasoning_format"):
        smol.chat_prompt(ASK, reasoning_format="loud")
    with pytest.raises(InvalidOptionError, match="parallel_tool_calls"):
        smol.chat_prompt(ASK, tools=[WEATHER], parallel_tool_calls="yes")  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError, match="control-token text"):
        smol.chat_prompt([*ASK, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"location": "<|im_end|>"}'}}]},
            {"role": "tool", "tool_call_id": "1", "content": "sunny"}], tools=[WEATHER], chat_template=qwen)
    prompt = smol.chat_prompt(ASK, tools=[WEATHER], chat_template=qwen)
    with llamaspec.Generator(smol, n_ctx=1024) as gen:
        with pytest.raises(InvalidOptionError, match="brings its own grammar"):
            gen.generate(prompt, 4, grammar='root ::= "a"')
        with pytest.raises(InvalidOptionError, match="brings its own grammar"):
            gen.generate(prompt, 4, json_schema={"type": "object"})
        with pytest.raises(InvalidOptionError, match="brings its own grammar"):
            gen.generate(prompt, 4, grammar_root="value")
        shown = smol.chat_prompt(ASK, tools=[WEATHER], tool_choice="none", chat_template=qwen)
        assert set(gen.generate(shown, 3, grammar='root ::= "a"+', temperature=0)) == {"a"}  # no tool grammar
    parser = prompt.parser()
    parser.finish()
    with pytest.raises(InvalidOptionError, match="finished"):
        parser.feed("more")
    with pytest.raises(InvalidOptionError, match="finished"):
        parser.finish()
