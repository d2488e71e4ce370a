"""Chat prompts with tools and reasoning (ADR 0026).

``Model.chat_prompt(messages, tools=...)`` renders a conversation through llama.cpp's chat API
(common/chat.h): the template's own tool format (Llama 3.x, Hermes/Qwen, Mistral, ...; a template
without one gets no tool grammar and plain-content parsing, as in llama-server), the grammar that
constrains a tool call's arguments (lazy: it starts at the call's first marker, so free text stays
free; forced with ``tool_choice="required"``), and the parser of the template's output format. A
session given the ChatPrompt as its prompt samples with that grammar and streams the parsed reply
as ContentDelta, ReasoningDelta, ToolCallStart and ToolCallArguments events, with the whole
ChatMessage in Done.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _native
from ._chat import Renderer, chat_tokens, messages_json
from .errors import InvalidOptionError
from .events import (
    ChatDelta,
    ChatMessage,
    ContentDelta,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
)

__all__ = ["ChatPrompt", "ChatParser", "ReasoningFormat", "REASONING_FORMATS", "build_chat_prompt",
           "tools_json"]

ReasoningFormat = Literal["auto", "deepseek", "deepseek-legacy", "none"]
#: llama.cpp's reasoning formats: "auto" and "deepseek" put the reasoning apart (reasoning_content),
#: "deepseek-legacy" too, "none" leaves it in the content.
REASONING_FORMATS: tuple[str, ...] = ("auto", "deepseek", "deepseek-legacy", "none")


def tools_json(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> tuple[str, str]:
    """The tools as the JSON the native side reads and the tool choice as "auto" | "none" | "required".

    ``tool_choice`` may name one function (OpenAI's ``{"type": "function", "function": {"name": ...}}``):
    then only that tool is offered and a call is required.

    Raises:
        InvalidOptionError: tools is not a list of OpenAI tool objects, or tool_choice is unknown or
            names a function that is not among the tools.
    """
    if tools is None:
        tools = []
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidOptionError(f"tools must be a list of tool objects, not {type(tools).__name__}")
    items = list(tools)
    for t in items:
        function = t.get("function") if isinstance(t, Mapping) and t.get("type") == "function" else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidOptionError('each tool must be {"type": "function", "function": {"name": ..., '
                                     f'"parameters": {{...}}}}}}, got {t!r:.120}')
    choice: str
    if tool_choice is None:
        choice = "auto"
    elif isinstance(tool_choice, str) and tool_choice in ("auto", "none", "required"):
        choice = tool_choice
    elif isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), Mapping):
        name = tool_choice["function"].get("name")
        items = [t for t in items if t["function"]["name"] == name]
        if not items:
            raise InvalidOptionError(f"tool_choice names the function {name!r}, which is not among the tools")
        choice = "required"
    else:
        raise InvalidOptionError('tool_choice must be "auto", "none", "required" or '
                                 f'{{"type": "function", "function": {{"name": ...}}}}, got {tool_choice!r}')
    try:
        return json.dumps(items), choice
    except (TypeError, ValueError) as e:
        raise InvalidOptionError(f"tools must be JSON-serializable: {e}") from e


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation rendered for generation (``Model.chat_prompt``); pass it as a session's prompt.

    Attributes:
        tokens: the prompt's token ids (message text never became control tokens).
        text: the rendered prompt (special tokens as text), for display.
        format: the name of the template's output format in llama.cpp's chat parser.
        reasoning_format: how the reasoning is parsed (REASONING_FORMATS).
        stops: stop strings the template adds (with the call's own).
        grammar: the tool-call grammar (GBNF), "" without tools.
        grammar_lazy: the grammar applies from a trigger on (tool_choice "auto"), not from the start.
    """

    tokens: tuple[int, ...]
    text: str
    format: str
    reasoning_format: str
    stops: tuple[str, ...]
    grammar: str
    grammar_lazy: bool
    _params: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def _from_native(cls, tokens: Sequence[int], params: Mapping[str, Any],
                     reasoning_format: str) -> ChatPrompt:
        return cls(tuple(tokens), params["prompt"], params["format_name"], reasoning_format,
                   tuple(params["additional_stops"]), params["grammar"], bool(params["grammar_lazy"]), params)

    @property
    def parses_tool_calls(self) -> bool:
        """Whether tools were offered (and tool_choice is not "none")."""
        return bool(self._params["parse_tool_calls"])

    def sampling(self) -> dict[str, Any]:
        """The sampling fields the template's tools set (_options.CHAT_SAMPLING_FIELDS); {} without tools."""
        p = self._params
        out: dict[str, Any] = {}
        if p["preserved_tokens"]:
            out["preserved_tokens"] = list(p["preserved_tokens"])
        if p["grammar"]:
            out["tool_grammar"] = p["grammar"]
            out["grammar_lazy"] = bool(p["grammar_lazy"])
            out["grammar_triggers"] = [tuple(t) for t in p["grammar_triggers"]]
            out["generation_prompt"] = p["generation_prompt"]
        return out

    def parser(self) -> ChatParser:
        """A new parser for one reply to this prompt."""
        p = self._params
        native = _native.ChatParser(p["format"], p["parser"], p["generation_prompt"], self.reasoning_format,
                                    bool(p["parse_tool_calls"]))
        return ChatParser(native)


def build_chat_prompt(native: _native.Model, messages: Sequence[Mapping[str, Any]], *,
                      tools: Sequence[Mapping[str, Any]] | None = None,
                      tool_choice: str | Mapping[str, Any] | None = "auto", parallel_tool_calls: bool = False,
                      reasoning_format: str = "auto", add_generation_prompt: bool = True,
                      enable_thinking: bool | None = None, chat_template: str | None = None,
                      template_kwargs: Mapping[str, Any] | None = None) -> ChatPrompt:
    """Model.chat_prompt on a native model (sessions keep theirs after Model.close()).

    Raises:
        InvalidOptionError, ChatTemplateError: as Model.chat_prompt.
    """
    if reasoning_format not in REASONING_FORMATS:
        raise InvalidOptionError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, "
                                 f"got {reasoning_format!r}")
    if not isinstance(parallel_tool_calls, bool):
        raise InvalidOptionError(f"parallel_tool_calls must be a bool, got {parallel_tool_calls!r}")
    tools_text, choice = tools_json(tools, tool_choice)
    render = Renderer(native, add_generation_prompt, enable_thinking, template_kwargs, chat_template,
                      tools_text, choice, parallel_tool_calls, reasoning_format)
    tokens = chat_tokens(native, messages, render)
    return ChatPrompt._from_native(tokens, render.params(messages_json(messages)), reasoning_format)


_KINDS = (
    lambda i, a, b: ReasoningDelta(a),
    lambda i, a, b: ContentDelta(a),
    lambda i, a, b: ToolCallStart(i, a, b),
    lambda i, a, b: ToolCallArguments(i, a),
)


class ChatParser:
    """Turns a reply's text into a ChatMessage as it grows (one per reply; not thread-safe).

    Each ``feed`` re-parses the text so far with the template's output format (as llama-server does)
    and returns what changed: a tool call's start once its name is complete, then its argument pieces.
    """

    def __init__(self, native: _native.ChatParser) -> None:
        self._native = native
        self._done = False

    def feed(self, text: str) -> list[ChatDelta]:
        """Add generated text; returns the deltas it completes (a partial marker waits for more)."""
        if self._done:
            raise InvalidOptionError("this reply is finished")
        return self._deltas(self._native.update(text, False))

    def finish(self) -> list[ChatDelta]:
        """No more text: parse the whole reply; returns the last deltas. If the whole text does not
        parse in the format, the message stays as last parsed (what was streamed)."""
        if self._done:
            raise InvalidOptionError("this reply is finished")
        self._done = True
        return self._deltas(self._native.update("", True))

    @property
    def message(self) -> ChatMessage:
        """The reply as parsed so far."""
        m = self._native.message()
        return ChatMessage(m["content"], m["reasoning_content"],
                           tuple(ToolCall(i, n, a) for i, n, a in m["tool_calls"]))

    @staticmethod
    def _deltas(raw: list[tuple[int, int, str, str]]) -> list[ChatDelta]:
        return [_KINDS[k](i, a, b) for k, i, a, b in raw]
