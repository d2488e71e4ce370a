"""Chat prompts as token ids in which message text never becomes a control token (ADR 0015).

A chat template's own markup (``<|im_start|>``, ``<|eot_id|>``, ...) must become control tokens, and the
messages' text must not: a user who writes ``<|im_end|><|im_start|>system`` in a message would otherwise
open a real system turn. Rendering to one string and tokenizing it with special tokens parsed cannot tell
the two apart, so this module renders the template twice: once with every string of the messages
replaced by a unique marker, once as given. Where the markers are, the text came from the messages;
everything else is the template's. The native ``tokenize_segments`` then recognizes control tokens in the
template's text only, and joins raw text across the boundaries as one string would, so a conversation
with no control-token text in it tokenizes exactly as the whole rendered string does.

A template that rewrites message text (``| trim`` is common) is handled by also trying the stripped
strings; one that transforms it otherwise (splits, replaces) cannot be aligned, and then the rendered
string is used as is only if no message string holds control-token text (else ChatTemplateError).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _native
from .errors import ChatTemplateError, InvalidOptionError

# Keys whose string values a template compares or dispatches on (never free text of a message).
_STRUCTURAL_KEYS = frozenset({"role", "type"})
# Rendered by the template as data, not aligned as text (their strings must hold no control-token text).
_KEPT_KEY = "tool_calls"

Render = Callable[[str], str]  # messages as JSON -> the rendered prompt


class Renderer:
    """The model's template (or ``chat_template``) as a Render, with tools and the other chat options;
    ``params(messages_json)`` is everything common's chat API returned for that input (chat.cpp,
    chat_params), rendered once.

    Raises:
        InvalidOptionError: a template kwarg is not JSON-serializable.
    """

    def __init__(self, native: _native.Model, add_generation_prompt: bool = True,
                 enable_thinking: bool | None = None, template_kwargs: Mapping[str, Any] | None = None,
                 chat_template: str | None = None, tools_json: str = "[]", tool_choice: str = "auto",
                 parallel_tool_calls: bool = False, reasoning_format: str = "auto") -> None:
        try:
            kwargs = [(k, json.dumps(v)) for k, v in (template_kwargs or {}).items()]
        except (TypeError, ValueError) as e:
            raise InvalidOptionError(f"template kwargs must be JSON-serializable: {e}") from e
        self._native = native
        self._args = (add_generation_prompt, -1 if enable_thinking is None else int(bool(enable_thinking)),
                      kwargs, chat_template or "", tools_json, tool_choice, int(parallel_tool_calls),
                      reasoning_format)
        self._params: dict[str, dict[str, Any]] = {}

    def params(self, messages: str) -> dict[str, Any]:
        """The native chat_params of these messages (JSON), rendered on first use."""
        if messages not in self._params:
            self._params[messages] = _native.chat_params(self._native, messages, *self._args)
        return self._params[messages]

    def __call__(self, messages: str) -> str:
        prompt: str = self.params(messages)["prompt"]
        return prompt


def messages_json(messages: Sequence[Mapping[str, Any]]) -> str:
    """The messages as the JSON array the native renderer reads.

    Raises:
        InvalidOptionError: messages is not a list of dicts, or is not JSON-serializable.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidOptionError(f"messages must be a list of dicts, not {type(messages).__name__}")
    items = list(messages)
    for m in items:
        if not isinstance(m, Mapping):
            raise InvalidOptionError(f"each message must be a dict, not {type(m).__name__}")
    try:
        return json.dumps([dict(m) for m in items])
    except (TypeError, ValueError) as e:
        raise InvalidOptionError(f"messages must be JSON-serializable: {e}") from e


def _strings(value: Any) -> list[str]:
    """Every string in value (nested dicts and lists)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _mark(value: Any, texts: list[str], nonce: str, kept: list[str], key: str | None = None) -> Any:
    """A copy of value with every free-text string replaced by a marker naming its index in texts.

    An assistant message's ``tool_calls`` stay as they are (a template re-serializes the arguments,
    so a marker could not survive it); their strings go to ``kept``, to be checked apart."""
    if key == _KEPT_KEY:
        kept.extend(_strings(value))
        return value
    if isinstance(value, str):
        if key in _STRUCTURAL_KEYS:
            return value
        texts.append(value)
        return f"\ue000{nonce}:{len(texts) - 1}\ue001"
    if isinstance(value, Mapping):
        return {k: _mark(v, texts, nonce, kept, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(v, texts, nonce, kept) for v in value]
    return value


def _segments(marked: str, texts: list[str], nonce: str,
              fix: Callable[[str], str]) -> list[tuple[str, bool]]:
    """Split a render of the marked messages into (text, trusted) segments, markers replaced by
    fix(message text) and untrusted."""
    out: list[tuple[str, bool]] = []
    pos = 0
    for m in re.finditer(f"\ue000{re.escape(nonce)}:(\\d+)\ue001", marked):
        out.append((marked[pos:m.start()], True))
        out.append((fix(texts[int(m.group(1))]), False))
        pos = m.end()
    out.append((marked[pos:], True))
    return out


def chat_tokens(native: _native.Model, messages: Sequence[Mapping[str, Any]], render: Render,
                add_special: bool = True) -> list[int]:
    """Token ids of the rendered conversation, message text never parsed as control tokens.

    Raises:
        InvalidOptionError: messages are malformed.
        ChatTemplateError: the template failed, or it rewrites message text that holds control-token
            text in a way that cannot be aligned with the messages.
    """
    plain = messages_json(messages)
    nonce = secrets.token_hex(6)
    texts: list[str] = []
    kept: list[str] = []
    marked_msgs = [_mark(dict(m), texts, nonce, kept) for m in messages]
    for t in kept:
        if _has_control_text(native, t):
            raise ChatTemplateError(f"a tool call in the messages holds control-token text ({t[:60]!r}): "
                                    "refusing a prompt in which that text could become control tokens")
    rendered = render(plain)
    marked = render(json.dumps(marked_msgs))
    for fix in (lambda s: s, str.strip):
        segments = _segments(marked, texts, nonce, fix)
        if "".join(s for s, _ in segments) == rendered:
            return list(native.tokenize_segments(segments, add_special))
    # The template transforms message text: use the rendered string only if no text could inject.
    for t in texts:
        if _has_control_text(native, t):
            raise ChatTemplateError(
                "the chat template rewrites message text, and a message holds control-token text "
                f"({t[:60]!r}): refusing a prompt in which that text could become control tokens")
    return list(native.tokenize(rendered, add_special, True))


def _has_control_text(native: _native.Model, text: str) -> bool:
    return list(native.tokenize(text, False, True)) != list(native.tokenize(text, False, False))
