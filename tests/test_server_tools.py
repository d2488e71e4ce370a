"""Tool calls and reasoning over HTTP (issue 18), driven by the official `openai` client: `tools`,
`tool_choice` and `parallel_tool_calls` go through the template's own tool format (here the pinned
tree's functionary v3.2 template, whose grammar forces a call at once), replies carry `tool_calls`
and `finish_reason: "tool_calls"`, streams carry them as OpenAI's deltas; a thinking template puts
the reasoning in `reasoning_content`. Everything equals the library's greedy reply, and the server
drafts (SmolLM2 for itself), so speculation is checked lossless on the way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import llamaspec

from .conftest import WEATHER_TOOL, pinned_templates
from .server_util import Server, running

pytestmark = pytest.mark.real_model

WEATHER = WEATHER_TOOL
TIME: Any = {"type": "function",
             "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
FUNCTIONARY = "meetkai-functionary-medium-v3.2"
THINKING = "Qwen3.5-4B"  # its generation prompt opens a <think> block


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-tools-logs")


@pytest.fixture(scope="module")
def tools(smol_path: str, logs: Path) -> Iterator[Server]:
    tmpl = pinned_templates() / f"{FUNCTIONARY}.jinja"
    with running(smol_path, "-c", "2048", "-t", "2", "--chat-template-file", str(tmpl), "-md", smol_path,
                 "--draft-max", "4", log_dir=logs) as s:
        yield s


@pytest.fixture(scope="module")
def thinking(smol_path: str, logs: Path) -> Iterator[Server]:
    tmpl = pinned_templates() / f"{THINKING}.jinja"
    with running(smol_path, "-c", "2048", "-t", "2", "--chat-template-file", str(tmpl), log_dir=logs) as s:
        yield s


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def library_reply(model: llamaspec.Model, template: str, max_tokens: int,
                  **chat: Any) -> llamaspec.ChatMessage:
    tmpl = (pinned_templates() / f"{template}.jinja").read_text()
    prompt = model.chat_prompt(ASK, chat_template=tmpl, **chat)
    with llamaspec.Generator(model, n_ctx=2048, n_threads=2) as gen:
        return gen.chat(prompt, max_tokens, temperature=0)


def test_a_required_tool_call_equals_the_library(tools: Server, smol: llamaspec.Model) -> None:
    """Whole and streamed: one call of get_weather with the library's arguments (the grammar made
    them), finish_reason tool_calls, no content; a stream's first delta of the call carries index,
    id, type and name, the later ones the arguments, which join into the whole reply's."""
    want = library_reply(smol, FUNCTIONARY, 48, tools=[WEATHER], tool_choice="required")
    assert want.tool_calls and want.tool_calls[0].name == "get_weather"
    kw: Any = {"model": "x", "messages": ASK, "max_tokens": 48, "temperature": 0, "tools": [WEATHER],
               "tool_choice": "required"}
    r = client(tools).chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content in (None, "")
    assert msg.tool_calls is not None and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert call.function.arguments == want.tool_calls[0].arguments
    assert json.loads(call.function.arguments)["location"]

    chunks = list(client(tools).chat.completions.create(stream=True, **kw))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function is not None and first.function.name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.function is not None and not d.function.name for d in rest)
    args = "".join((d.function.arguments or "") for d in deltas if d.function)
    assert args == want.tool_calls[0].arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_tool_choice_by_name_and_none(tools: Server, smol: llamaspec.Model) -> None:
    """A named function is the one called; "none" shows the tools and parses no call (the reply is
    the library's text)."""
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    r = client(tools).chat.completions.create(model="x", messages=ASK, max_tokens=32, temperature=0,
                                              tools=[WEATHER, TIME], tool_choice=named)
    assert r.choices[0].message.tool_calls and r.choices[0].message.tool_calls[0].function.name == "get_time"
    want = library_reply(smol, FUNCTIONARY, 24, tools=[WEATHER], tool_choice="none")
    r = client(tools).chat.completions.create(model="x", messages=ASK, max_tokens=24, temperature=0,
                                              tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == want.content
    assert r.choices[0].finish_reason != "tool_calls"


def test_a_tool_result_turn_renders(tools: Server) -> None:
    """The call and its result go back as messages (the assistant's tool_calls, a tool message)."""
    r = client(tools).chat.completions.create(model="x", messages=ASK, max_tokens=48, temperature=0,
                                              tools=[WEATHER], tool_choice="required")
    msg = r.choices[0].message
    assert msg.tool_calls
    history: Any = [*ASK, msg.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "sunny, 21 C"}]
    body = {"messages": history, "tools": [WEATHER]}
    prompt = httpx.post(f"{tools.url}/apply-template", json=body, timeout=60).json()["prompt"]
    assert "sunny, 21 C" in prompt and "get_weather" in prompt
    r2 = client(tools).chat.completions.create(model="x", messages=history, max_tokens=8, tools=[WEATHER])
    n_history = httpx.post(f"{tools.url}/v1/chat/completions/input_tokens", timeout=60,
                           json={"messages": history, "tools": [WEATHER]}).json()["input_tokens"]
    assert r.usage is not None and r2.usage is not None
    assert r2.usage.prompt_tokens == n_history > r.usage.prompt_tokens  # the whole history went in


@pytest.mark.parametrize("body", [
    {"tools": [WEATHER], "tool_choice": "sometimes"},
    {"tools": [{"type": "retrieval"}]},
    {"tool_choice": "required"},
    {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tools": [WEATHER], "tool_choice": "required", "grammar": 'root ::= "a"'},
    {"reasoning_format": "loud"},
])
def test_bad_tool_fields_are_400(tools: Server, body: dict[str, Any]) -> None:
    for stream in (False, True):
        r = httpx.post(f"{tools.url}/v1/chat/completions", timeout=60,
                       json={"messages": ASK, "max_tokens": 4, "stream": stream, **body})
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_reasoning_content_equals_the_library(thinking: Server, smol: llamaspec.Model) -> None:
    """A template that opens a <think> block: the reply is reasoning until </think> (SmolLM2 never
    closes it here), in reasoning_content whole and in reasoning_content deltas streamed;
    reasoning_format "none" leaves it in the content."""
    want = library_reply(smol, THINKING, 24)
    assert want.reasoning_content and not want.content
    kw: Any = {"model": "x", "messages": ASK, "max_tokens": 24, "temperature": 0}
    r = client(thinking).chat.completions.create(**kw)
    extra = r.choices[0].message.model_extra or {}
    assert extra["reasoning_content"] == want.reasoning_content and not r.choices[0].message.content
    chunks = list(client(thinking).chat.completions.create(stream=True, **kw))
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for c in chunks if c.choices)
    assert streamed == want.reasoning_content
    inline = client(thinking).chat.completions.create(**kw, extra_body={"reasoning_format": "none"})
    want_inline = library_reply(smol, THINKING, 24, reasoning_format="none")
    assert inline.choices[0].message.content == want_inline.content
    assert not (inline.choices[0].message.model_extra or {}).get("reasoning_content")
