"""The events a generation streams: PromptProgress* (when asked for), Token*, then EndOfGeneration (if
the model stopped), then Done. A chat call (``messages=`` or a ChatPrompt) also streams what its
tokens add to the parsed message, each right after the Token that completed it: ContentDelta,
ReasoningDelta, ToolCallStart and ToolCallArguments; its Done carries the whole ChatMessage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from .stats import SpecStats

__all__ = ["Token", "TopLogprob", "EndOfGeneration", "Done", "Stats", "PromptProgress", "GenerationStats",
           "Event", "FinishReason", "ContentDelta", "ReasoningDelta", "ToolCallStart", "ToolCallArguments",
           "ToolCall", "ChatMessage", "ChatDelta"]

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One of the most likely tokens at a position (``logprobs=True, top_logprobs=n``).

    Attributes:
        id: the token id.
        text: the token's text (a token that is part of a multi-byte character shows U+FFFD).
        logprob: its natural-log probability.
        bytes: the token's bytes, exactly.
    """

    id: int
    text: str
    logprob: float
    bytes: bytes


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token.

    Attributes:
        id: the token id.
        text: the text this token completes; "" while a multi-byte character or a possible stop
            string is held back (it then arrives with a later token).
        logprob: with ``logprobs=True``, the token's natural-log probability: the log-softmax of the
            target's raw logits at its position (llama-server's default), or, with
            ``post_sampling_probs=True``, of the distribution the sampler drew it from (after its
            filters, temperature included); else None. Speculation does not change it beyond
            float rounding.
        top_logprobs: with ``logprobs=True``, the ``top_logprobs`` most likely tokens at this
            position by the same measure, most likely first (ties by id; after the sampler's filters
            only tokens it left a chance); else None.
        origin: how it was produced: "draft" (a drafted token the target accepted), "target" (the
            target's own token in a step that verified drafts: the correction after a rejected
            draft token, or the extra one after all were accepted) or "plain" (a step without a
            draft: plain decoding, the first token, a step the drafter sat out). Not part of
            equality: a token equals the same token produced another way (speculative output
            compares equal to plain output).
        drafted: for a "target" token, how many drafted tokens its verify step proposed (the
            accepted ones came just before it: drafted minus those were rejected); 0 for the others.
            Not part of equality.
    """

    id: int
    text: str
    logprob: float | None = None
    top_logprobs: tuple[TopLogprob, ...] | None = None
    origin: Literal["draft", "target", "plain"] = field(default="plain", compare=False)
    drafted: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """How far the prompt has been decoded (``prompt_progress=True``): one event before the first
    chunk (processed == cached) and one after each ``n_batch`` chunk; the last has processed == total.

    Attributes:
        processed: prompt tokens in the sequence's memory so far (the cached ones included).
        total: tokens in the prompt.
        prompt_time: seconds spent decoding the prompt so far.
        cached: prompt tokens reused from the sequence's memory (the prompt cache), not decoded.
    """

    processed: int
    total: int
    prompt_time: float
    cached: int = 0


@dataclass(frozen=True, slots=True)
class EndOfGeneration:
    """The model emitted an end-of-generation token (which is neither emitted nor counted)."""


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """Figures of one generation call.

    Attributes:
        prompt_tokens: tokens in the prompt.
        cached_tokens: of those, tokens reused from what the sequence's memory held from earlier
            calls (the prompt cache: the longest common prefix, at most all but the last token),
            so not decoded again; 0 with ``cache_prompt=False``.
        tokens: generated tokens (the end-of-generation token excluded).
        prefill_time: seconds spent decoding the prompt.
        time_to_first_token: seconds from the start of the call to the first token.
        generation_time: seconds from the first to the last token.
        total_time: seconds from the start of the call to its end.
        tokens_per_second: decode rate, (tokens - 1) / generation_time (0.0 under 2 tokens).
        finish_reason: "stop" (end-of-generation or a stop string), "length" (max_tokens) or
            "cancelled".
        seed: the sampler seed used (random unless given).
        iterations: target passes after the prompt (speculative sessions: verifies; plain
            generation: one per token after the first, which comes from the prompt's pass).
        drafts_generated: draft tokens proposed in this call (0 for plain generation).
        drafts_accepted: draft tokens accepted in this call (0 for plain generation).
        seq: the sequence the call ran on (0 but on sessions with n_seq > 1).
    """

    prompt_tokens: int
    tokens: int
    prefill_time: float
    time_to_first_token: float
    generation_time: float
    total_time: float
    tokens_per_second: float
    finish_reason: FinishReason
    seed: int
    iterations: int = 0
    drafts_generated: int = 0
    drafts_accepted: int = 0
    seq: int = 0
    cached_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """drafts_accepted / drafts_generated of this call (0.0 when nothing was drafted)."""
        return self.drafts_accepted / self.drafts_generated if self.drafts_generated else 0.0

    @classmethod
    def _from_native(cls, d: dict[str, Any]) -> GenerationStats:
        for k in ("iterations", "drafts_generated", "drafts_accepted", "seq"):
            if k in d:
                d[k] = int(d[k])
        return cls(**d)


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text added to a chat reply's content (its reasoning and tool-call markup left out)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text added to a chat reply's reasoning (a thinking model's ``<think>...</think>`` and the
    other formats llama.cpp's chat parser knows; ``reasoning_format="none"`` leaves it in the content)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its position among the reply's calls, its id and the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A piece of tool call ``index``'s arguments (JSON text; the pieces concatenate to it)."""

    index: int
    text: str


ChatDelta = Union[ContentDelta, ReasoningDelta, ToolCallStart, ToolCallArguments]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model asked for.

    Attributes:
        id: the call's id (the model's, or a random one as llama-server makes).
        name: the function's name.
        arguments: its arguments as JSON text (as OpenAI's API carries them).
    """

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """The arguments as Python values (``json.loads``; ValueError if they are not JSON)."""
        return json.loads(self.arguments)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """A chat reply parsed with its template's output format (ChatPrompt).

    Attributes:
        content: the reply's text, without the reasoning and the tool-call markup.
        reasoning_content: the reasoning ("" when the model did not think or the format keeps it inline).
        tool_calls: the tool calls, in order.
    """

    content: str
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The message as an OpenAI chat message (``role`` "assistant"), e.g. to append to the
        conversation: content None when empty with tool calls, as OpenAI writes it."""
        out: dict[str, Any] = {"role": "assistant",
                               "content": None if not self.content and self.tool_calls else self.content}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        return out


@dataclass(frozen=True, slots=True)
class Done:
    """Always the last event of a generation.

    Attributes:
        stats: the call's figures.
        message: of a chat call (``messages=`` or a ChatPrompt), the reply parsed; else None.
    """

    stats: GenerationStats
    message: ChatMessage | None = None


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of a speculative session's cumulative statistics, streamed every
    ``emit_stats_every`` tokens when asked for (MTP.stream_events)."""

    snapshot: SpecStats


Event = Union[Token, EndOfGeneration, Done, Stats, PromptProgress, ContentDelta, ReasoningDelta,
              ToolCallStart, ToolCallArguments]
