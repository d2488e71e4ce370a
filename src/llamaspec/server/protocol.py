"""Request bodies (pydantic: a known field of the wrong type or range is a 400 naming it; unknown fields
are ignored), their mapping onto llamaspec's sampling options, and the response pieces every endpoint
shares (usage, timings, errors). Field names and shapes follow OpenAI's API and llama-server's
(../shared/design/server-spec.md was the checklist)."""

from __future__ import annotations

import base64
import json
import math
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .. import __version__
from ..events import (
    ChatDelta,
    ChatMessage,
    ContentDelta,
    GenerationStats,
    PromptProgress,
    ReasoningDelta,
    Token,
    ToolCallStart,
)


class ApiError(Exception):
    """An error the server answers with ``{"error": {"code", "message", "type", ...}}``."""

    TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        413: "invalid_request_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }

    def __init__(self, status: int, message: str, type: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or self.TYPES.get(status, "server_error")
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.extra}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class SpeculativeFields(BaseModel):
    """Per-request speculation (llama-server compiles these out)."""

    model_config = ConfigDict(extra="ignore")
    n_max: int | None = Field(None, ge=0)
    p_min: float | None = Field(None, ge=0.0, le=1.0)


class Sampling(BaseModel):
    """The fields every completion endpoint shares."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=-1)
    max_completion_tokens: int | None = Field(None, ge=-1)
    n_predict: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=16)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    typical_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(None, gt=0.0)
    repeat_last_n: int | None = Field(None, ge=-1)
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = None
    grammar: str | None = None
    json_schema: Any = None  # llama-server's field: a JSON Schema the output follows
    ignore_eos: bool = False
    timings_per_token: bool = False
    return_progress: bool = False
    # a stream's chunks say how each of their tokens was produced: "token_origin", one of "draft",
    # "target", "plain" per token, and "token_drafted", the drafts a "target" token's step proposed
    # (0 for the others) (llamaspec's fields; the OpenAI format is unchanged without them)
    return_token_origin: bool = False
    cache_prompt: bool = True  # reuse what the sequence holds of the prompt (llama-server's field)
    # log-probabilities: OpenAI's logprobs (chat: a bool with top_logprobs; /v1/completions: the number
    # of top candidates) and llama-server's n_probs (0: off) and post_sampling_probs
    logprobs: bool | int | None = Field(None, ge=0, le=20)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    n_probs: int | None = Field(None, ge=0, le=20)
    post_sampling_probs: bool = False
    verbose: bool = False
    speculative: SpeculativeFields | None = None

    def limit(self, default: int) -> int:
        """The requested maximum of generated tokens (-1: no limit but the context)."""
        for v in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if v is not None:
                return v
        return default

    def options(
        self, defaults: dict[str, Any], n_vocab: int, tokenize: Callable[[str, bool, bool], list[int]]
    ) -> dict[str, Any]:
        """llamaspec sampling options: the server's defaults, then this request's fields."""
        out = dict(defaults)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "typical_p",
            "presence_penalty",
            "frequency_penalty",
            "repeat_penalty",
            "grammar",
        ):
            v = getattr(self, name)
            if v is not None:
                out[name] = v
        if self.repeat_last_n is not None:
            out["penalty_last_n"] = self.repeat_last_n
        if self.seed is not None:
            if self.seed < 0:
                out.pop("seed", None)  # llama-server's -1: random
            else:
                out["seed"] = self.seed % 0xFFFFFFFF
        if self.stop is not None:
            out["stop"] = [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]
        if self.logit_bias:
            out["logit_bias"] = _logit_bias(self.logit_bias, n_vocab, tokenize)
        top = self.top_candidates()
        if top is not None:
            out.update(logprobs=True, top_logprobs=top, post_sampling_probs=self.post_sampling_probs)
        schema = self.output_schema()
        if schema is not None:
            if not isinstance(schema, dict):
                raise ApiError(400, f"the JSON schema must be an object, not {type(schema).__name__}")
            if self.grammar is not None:  # as llama-server answers
                raise ApiError(400, "either a JSON schema or a grammar can be given, not both")
            out.pop("grammar", None)  # the request's schema wins over the server's default grammar
            out["json_schema"] = schema or {"type": "object"}  # an empty schema: any object
        return out

    def output_schema(self) -> Any:
        """The JSON schema the output must follow, or None (llama-server's json_schema field)."""
        return self.json_schema

    def top_candidates(self) -> int | None:
        """How many top candidates each token's log-probabilities list, or None for none: n_probs
        (llama-server's; 0 is off), else ``logprobs``: true with ``top_logprobs`` (0 when absent,
        OpenAI's chat fields) or a count (OpenAI's legacy completions). top_logprobs without
        logprobs is a 400 (OpenAI's and llama-server's answer)."""
        if self.n_probs:
            return self.n_probs
        if self.logprobs is None or self.logprobs is False:
            if self.top_logprobs is not None:
                raise ApiError(400, "top_logprobs requires logprobs to be set to true")
            return None
        return (self.top_logprobs or 0) if self.logprobs is True else int(self.logprobs)


def _logit_bias(
    v: dict[str, float | bool] | list[list[Any]],
    n_vocab: int,
    tokenize: Callable[[str, bool, bool], list[int]],
) -> dict[int, float]:
    """OpenAI's {"token id": bias} or llama-server's [[id, bias], ...]; false bans a token. A key that
    is text rather than an id biases each of its tokens (as llama-server does)."""
    pairs = list(v.items()) if isinstance(v, dict) else [tuple(p) for p in v]
    out: dict[int, float] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise ApiError(400, "logit_bias: each entry must be [token id, bias]")
        k, b = pair
        if b is False:
            bias = -math.inf
        elif isinstance(b, (int, float)) and not isinstance(b, bool) and not math.isnan(b):
            bias = float(b)
        else:
            raise ApiError(400, f"logit_bias[{k!r}]: {b!r} is not a number or false")
        if isinstance(k, int) and not isinstance(k, bool):
            toks = [k]
        elif isinstance(k, str) and k.strip().lstrip("-").isdigit():
            toks = [int(k)]
        elif isinstance(k, str):
            toks = tokenize(k, False, False)
        else:
            raise ApiError(400, f"logit_bias: {k!r} is neither a token id nor text")
        for tok in toks:
            if not 0 <= tok < n_vocab:
                raise ApiError(400, f"logit_bias: token id {tok} is out of range")
            out[tok] = bias
    return out


class ChatRequest(Sampling):
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_format: str | None = None

    def output_schema(self) -> Any:
        """OpenAI's response_format, read as llama-server reads it: ``json_object`` (any object, or
        its own ``schema``), ``json_schema`` (``json_schema.schema``) or ``text``; else json_schema."""
        rf = self.response_format
        if rf is None:
            return self.json_schema
        kind = rf.get("type")
        if kind == "json_object":
            return rf.get("schema", {}) if "schema" in rf or self.json_schema is None else self.json_schema
        if kind == "json_schema":
            wrapper = rf.get("json_schema")
            if not isinstance(wrapper, dict):
                raise ApiError(400, "response_format.json_schema must be an object holding a schema")
            return wrapper.get("schema", {})
        if kind in (None, "", "text"):
            return self.json_schema
        raise ApiError(400, f'response_format type must be "text", "json_object" or "json_schema", '
                            f"not {kind!r}")

    def top_candidates(self) -> int | None:
        """As on every endpoint, but chat's ``logprobs`` is a boolean (OpenAI's chat API)."""
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise ApiError(400, "logprobs must be a boolean (the number of candidates is top_logprobs)")
        return super().top_candidates()

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not v:
            raise ValueError("messages must not be empty")
        for i, m in enumerate(v):
            role = m.get("role")
            if not isinstance(role, str) or not role:
                raise ValueError(f"messages[{i}].role must be a non-empty string")
            content = m.get("content")
            if content is None:
                if role != "assistant" or not m.get("tool_calls"):
                    raise ValueError(f"messages[{i}].content is missing")
            elif isinstance(content, list):
                for j, part in enumerate(content):
                    if (
                        not isinstance(part, dict)
                        or part.get("type") != "text"
                        or not isinstance(part.get("text"), str)
                    ):
                        raise ValueError(
                            f"messages[{i}].content[{j}] must be {{'type': 'text', 'text': str}} "
                            "(this server takes text only)"
                        )
            elif not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        if len(v) >= 2 and v[-1]["role"] == "assistant" and v[-2]["role"] == "assistant":
            raise ValueError("the last two messages are both from the assistant")
        return v


class CompletionRequest(Sampling):
    """/v1/completions and llama-server's /completion (its ``content`` is an alias of ``prompt``)."""

    prompt: Any = None
    content: Any = None
    return_tokens: bool = False
    response_fields: list[str] | None = None

    @field_validator("prompt", "content")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (str, list, dict)):
            raise ValueError("expected a string, token ids, an object or a list")
        return v

    def prompt_value(self) -> Any:
        """The prompt, from ``prompt`` or ``content``."""
        v = self.prompt if self.prompt is not None else self.content
        if v is None:
            raise ApiError(400, "prompt is required")
        return v


_MARK = "\x00piece\x00"  # a placeholder no model text is compared with: json.dumps escapes it


@dataclass
class Envelope:
    """What every response and chunk of one OpenAI-style request shares (id, object, created, model)."""

    object: str  # "chat.completion" or "text_completion"
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.object == "chat.completion" else "cmpl-") + uuid.uuid4().hex

    def __call__(self, chunk: bool = False, **fields: Any) -> dict[str, Any]:
        """A response (or, with chunk, a stream chunk) with these fields."""
        obj = self.object + (".chunk" if chunk and self.object == "chat.completion" else "")
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": f"llamaspec-{__version__}",
            **fields,
        }

    def chunk_choice(self, text: str | None, finish: str | None = None,
                     logprobs: list[dict[str, Any]] | None = None,
                     delta: dict[str, Any] | None = None) -> dict[str, Any]:
        """The one choice of a stream chunk: a piece of text (with its tokens' log-probabilities when
        asked for), or (None) the finish chunk's; a chat chunk's ``delta`` may be given whole
        (protocol.chat_delta) instead of text."""
        lp = None if logprobs is None else {"content": logprobs}
        if self.object == "chat.completion":
            if delta is None:
                delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lp}
        return {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}

    def piece_writer(self) -> Callable[[str], str]:
        """The SSE event of a chunk that carries one piece of text (the hot path: one per token),
        the same JSON as ``sse(self(chunk=True, choices=[self.chunk_choice(text)]))`` with the JSON
        around the text rendered once."""
        choice = self.chunk_choice(_MARK)
        event = "data: " + json.dumps(self(chunk=True, choices=[choice]), ensure_ascii=False) + "\n\n"
        head, tail = event.rsplit(json.dumps(_MARK), 1)  # the last one: a model name could hold it
        return lambda piece: head + json.dumps(piece, ensure_ascii=False) + tail


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[int]


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request (llama-server's ``content`` accepted for ``input``)."""

    model_config = ConfigDict(extra="ignore")
    input: str | list[str] | list[int] | list[list[int]] | None = None
    content: str | list[str] | list[int] | list[list[int]] | None = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"

    def inputs(self) -> list[str | list[int]]:
        """The texts or token-id lists to embed, one vector each (a flat id list is one input)."""
        v = self.input if self.input is not None else self.content
        if v is None:
            raise ApiError(400, "input is required")
        if isinstance(v, str):
            return [v]
        if not v:
            raise ApiError(400, "input is empty")
        if all(isinstance(x, int) for x in v):
            return [[int(x) for x in v if isinstance(x, int)]]
        return [x if isinstance(x, str) else list(x) for x in v if not isinstance(x, int)]


def embedding_data(i: int, vector: list[float], encoding: str) -> dict[str, Any]:
    """One item of an embeddings response: the vector as floats, or with ``encoding_format: base64``
    its little-endian float32 bytes in base64 (what the openai client decodes)."""
    value: Any = vector
    if encoding == "base64":
        value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return {"object": "embedding", "index": i, "embedding": value}


def _timings(cached: int, decoded: int, prompt_s: float, n: int, predicted_s: float) -> dict[str, Any]:
    """llama-server's ``timings`` fields: the prompt's (``cache_n`` reused, ``prompt_n`` decoded) and
    the generation's (the first token is free: the rate is over n - 1 steps)."""
    prompt_ms = prompt_s * 1e3
    predicted_ms = predicted_s * 1e3
    return {
        "cache_n": cached,
        "prompt_n": decoded,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / decoded if decoded else 0.0,
        "prompt_per_second": decoded / prompt_s if prompt_s > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (n - 1) if n > 1 and predicted_ms > 0 else 0.0,
        "predicted_per_second": 1e3 / predicted_ms * (n - 1) if n > 1 and predicted_ms > 0 else 0.0,
    }


def timings(st: GenerationStats, spec: bool) -> dict[str, Any]:
    """llama-server's ``timings`` of a finished call, and ours (the speculative figures)."""
    n = st.tokens
    decoded = st.prompt_tokens - st.cached_tokens
    out = _timings(st.cached_tokens, decoded, st.prefill_time, n, st.generation_time)
    if spec:
        out["draft_n"] = st.drafts_generated
        out["draft_n_accepted"] = st.drafts_accepted
        out["acceptance_rate"] = st.drafts_accepted / st.drafts_generated if st.drafts_generated else 0.0
        out["verify_steps"] = st.iterations
        out["mean_accepted_length"] = (n - 1) / st.iterations if st.iterations else 0.0
    return out


def progress(ev: PromptProgress) -> dict[str, Any]:
    """llama-server's ``prompt_progress`` and ``timings`` of a streamed progress chunk."""
    ms = ev.prompt_time * 1e3
    return {
        "prompt_progress": {"total": ev.total, "cache": ev.cached, "processed": ev.processed, "time_ms": ms},
        "timings": _timings(ev.cached, ev.processed - ev.cached, ev.prompt_time, 0, 0.0),
    }


def usage(calls: list[GenerationStats], one_prompt: bool = False) -> dict[str, Any]:
    """OpenAI's ``usage`` of a request's calls; ``one_prompt``: they are choices of one prompt, which
    counts once."""
    prompt = calls[0].prompt_tokens if one_prompt else sum(st.prompt_tokens for st in calls)
    completion = sum(st.tokens for st in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": calls[0].cached_tokens if one_prompt
                                  else sum(st.cached_tokens for st in calls)},
    }


def finish_reason(
    st: GenerationStats, message: ChatMessage | None = None
) -> Literal["stop", "length", "tool_calls"]:
    """OpenAI's finish_reason for a finished call: "tool_calls" when a chat reply that ended by
    itself holds tool calls (as llama-server)."""
    if st.finish_reason == "length":
        return "length"
    return "tool_calls" if message is not None and message.tool_calls else "stop"


def chat_delta(d: ChatDelta) -> dict[str, Any]:
    """A parsed reply's delta as a chat chunk's ``delta``: content, reasoning_content, or tool_calls
    (a call's first delta carries index, id, type and the function's name, later ones append to its
    arguments)."""
    if isinstance(d, ContentDelta):
        return {"content": d.text}
    if isinstance(d, ReasoningDelta):
        return {"reasoning_content": d.text}
    if isinstance(d, ToolCallStart):
        function = {"name": d.name, "arguments": ""}
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function", "function": function}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


def token_logprobs(t: Token, piece: bytes, post_sampling: bool) -> dict[str, Any]:
    """One generated token's entry of ``logprobs.content`` (chat and /v1/completions) and of
    llama-server's ``completion_probabilities``: id, token, bytes, logprob and top_logprobs, or with
    post_sampling_probs llama-server's prob and top_probs (probabilities after the sampler's filters).
    ``piece``: the token's bytes (its Token.text may be held back or joined to another's)."""
    value, top = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def number(lp: float) -> float:
        return math.exp(lp) if post_sampling else max(lp, -9999.0)  # JSON has no -inf

    return {
        "id": t.id,
        "token": piece.decode("utf-8", "replace"),
        "bytes": list(piece),
        value: number(t.logprob if t.logprob is not None else 0.0),
        top: [
            {"id": c.id, "token": c.text, "bytes": list(c.bytes), value: number(c.logprob)}
            for c in t.top_logprobs or ()
        ],
    }
