"""The ASGI application: routes, authentication, CORS, body limits and errors (ADR 0016).

Every route is ``async`` and never blocks the event loop on native work: tokenizing and templating run
in a worker thread, generation streams through ``ServedModel.generate`` (the engine wakes the loop per
event; streaming.py). Every error is ``{"error": {"code", "message", "type"}}`` with the status in
server-spec.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from .. import __version__
from ..chat import ChatPrompt
from ..errors import (
    ChatTemplateError,
    ContextOverflowError,
    InvalidOptionError,
    LlamaspecError,
    UnsupportedModelError,
)
from ..events import (
    ChatMessage,
    ContentDelta,
    Done,
    Event,
    PromptProgress,
    ReasoningDelta,
    Token,
    ToolCallArguments,
    ToolCallStart,
)
from ..model import Model
from .config import ServerConfig
from .engine import Call, QueueFull, ServedModel, open_session
from .guard import MAX_BODY, Guard, error_response
from .metrics import metrics_text
from .protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    Envelope,
    Sampling,
    TokenizeRequest,
    chat_delta,
    embedding_data,
    finish_reason,
    progress,
    timings,
    token_logprobs,
    usage,
)
from .streaming import EventStream, Result, collect_all, sse, sse_error, start_stream
from .webui import add_webui

logger = logging.getLogger("llamaspec.server")


B = TypeVar("B", bound=BaseModel)


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


async def _body(request: Request, model: type[B]) -> B:
    """The request body as ``model``: 413 over MAX_BODY, 400 for bad JSON or a field of the wrong
    type or range (named); unknown fields are ignored."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
    try:
        obj = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise ApiError(400, _validation_message(e)) from None


async def _chat_prompt(s: ServedModel, req: ChatRequest) -> ChatPrompt:
    """The chat request's prompt through the safe path (ADR 0015), with its tools (ADR 0026)."""
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise ApiError(400, "add_generation_prompt and continue_final_message cannot both be true")
        raise ApiError(501, "continue_final_message is not supported yet")
    kwargs = dict(req.chat_template_kwargs or {})

    def render() -> ChatPrompt:
        return s.model.chat_prompt(
            req.messages,
            tools=req.tools,
            tool_choice=req.tool_choice,
            parallel_tool_calls=bool(req.parallel_tool_calls),
            reasoning_format=req.reasoning_format or s.cfg.reasoning_format,
            add_generation_prompt=req.add_generation_prompt,
            chat_template=s.chat_template,
            **kwargs,
        )

    try:
        return await asyncio.to_thread(render)
    except (ChatTemplateError, InvalidOptionError) as e:
        raise ApiError(400, str(e)) from None


async def _completion_prompts(s: ServedModel, prompt: Any) -> list[list[int]]:
    """Token ids of each prompt: a str (special tokens parsed, as llama-server does), token ids,
    ``{"prompt_string": str}``, a list of those (one completion each), or ids and strings mixed in
    one list (one prompt, concatenated)."""

    def one(p: Any) -> list[int]:
        if isinstance(p, dict):
            if p.get("multimodal_data"):
                raise ApiError(501, "this model takes no images or audio (multimodal_data)")
            p = p.get("prompt_string")
        if isinstance(p, str):
            return s.model.tokenize(p, add_special=True, parse_special=True)
        if isinstance(p, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return list(p)
        raise ApiError(400, 'prompt: expected a string, token ids, {"prompt_string": ...} or a list of them')

    def mixed(items: list[Any]) -> list[int]:
        out: list[int] = []
        for k, x in enumerate(items):
            out += s.model.tokenize(x, add_special=k == 0, parse_special=True) if isinstance(x, str) else [x]
        return out

    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt)
    ):
        return [list(prompt)]  # token ids: nothing to tokenize, no thread hop
    if isinstance(prompt, list) and prompt and not all(isinstance(x, int) for x in prompt):
        if all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in prompt) and any(
            isinstance(x, int) for x in prompt
        ):
            return [await asyncio.to_thread(mixed, prompt)]
        return [await asyncio.to_thread(one, p) for p in prompt]
    return [await asyncio.to_thread(one, prompt)]


class _StreamTokens:
    """What a stream's chunks say about their tokens, when asked: log-probabilities (the choice's
    ``logprobs``) and origins (the chunk's ``token_origin``, with ``token_drafted``: for a "target"
    token the drafts its verify step proposed, else 0). Each token's entries wait for the chunk
    that carries its text (a token whose text is held back joins the next one's chunk; in a chat
    stream, the next chunk of the parsed reply); entries of tokens whose text never comes (a stop
    string's) are dropped, as in a whole response."""

    def __init__(
        self, piece: Callable[[int], bytes], post_sampling: bool, logprobs: bool, origin: bool
    ) -> None:
        self._piece = piece
        self._post = post_sampling
        self._logprobs: list[dict[str, Any]] | None = [] if logprobs else None
        self._origin: list[str] | None = [] if origin else None
        self._drafted: list[int] = []

    def add(self, ev: Token) -> None:
        """Hold this token's entries for the next chunk."""
        if self._logprobs is not None:
            self._logprobs.append(token_logprobs(ev, self._piece(ev.id), self._post))
        if self._origin is not None:
            self._origin.append(ev.origin)
            self._drafted.append(ev.drafted)

    def flush(self) -> tuple[list[dict[str, Any]] | None, dict[str, list[Any]]]:
        """The chunk being sent: its log-probability entries (None when not asked for) and its
        top-level fields (``token_origin`` and ``token_drafted`` when asked for)."""
        lp, self._logprobs = self._logprobs, [] if self._logprobs is not None else None
        if self._origin is None:
            return lp, {}
        fields: dict[str, list[Any]] = {"token_origin": self._origin, "token_drafted": self._drafted}
        self._origin, self._drafted = [], []
        return lp, fields

    def take(self, ev: Token) -> tuple[list[dict[str, Any]] | None, dict[str, list[Any]]] | None:
        """flush() for this token's chunk, or None while its text is held back."""
        self.add(ev)
        return self.flush() if ev.text else None


def _stream_tokens(s: ServedModel, req: Sampling) -> _StreamTokens | None:
    logprobs = req.top_candidates() is not None
    if not logprobs and not req.return_token_origin:
        return None
    return _StreamTokens(s.model.token_to_piece, req.post_sampling_probs, logprobs, req.return_token_origin)


async def _openai_stream(
    env: Envelope, events: AsyncIterator[Event], spec: bool, req: Sampling, tokens: _StreamTokens | None
) -> AsyncIterator[str]:
    """OpenAI's chunk sequence for a chat or text completion: (chat: the role chunk), a chunk per
    piece of text (chat: per delta of the parsed reply: content, reasoning_content, tool_calls; with
    the log-probabilities and origins of its tokens when asked for), prompt progress when asked for,
    the finish chunk with llama-server's timings, the usage chunk with stream_options.include_usage,
    then [DONE]; an error after the start is an SSE error event."""
    piece = env.piece_writer()
    try:
        if env.object == "chat.completion":
            role = {
                "index": 0,
                "delta": {"role": "assistant", "content": None},
                "finish_reason": None,
                "logprobs": None,
            }
            yield sse(env(chunk=True, choices=[role]))
        chat = env.object == "chat.completion"
        async for ev in events:
            if isinstance(ev, PromptProgress):
                yield sse(env(chunk=True, choices=[], **progress(ev)))
            elif isinstance(ev, Token) and chat:
                if tokens is not None:  # a chat stream's text is the parsed reply's deltas
                    tokens.add(ev)
            elif isinstance(ev, Token) and tokens is not None:
                taken = tokens.take(ev)
                if taken is not None:
                    lp, extra = taken
                    yield sse(env(chunk=True, choices=[env.chunk_choice(ev.text, logprobs=lp)], **extra))
            elif isinstance(ev, Token) and ev.text:
                yield piece(ev.text)
            elif isinstance(ev, ContentDelta) and tokens is None:
                yield piece(ev.text)
            elif isinstance(ev, (ContentDelta, ReasoningDelta, ToolCallStart, ToolCallArguments)):
                lp, extra = (None, {}) if tokens is None else tokens.flush()
                choice = env.chunk_choice(None, logprobs=lp, delta=chat_delta(ev))
                yield sse(env(chunk=True, choices=[choice], **extra))
            elif isinstance(ev, Done):
                finish = env.chunk_choice(None, finish_reason(ev.stats, ev.message))
                yield sse(env(chunk=True, choices=[finish], timings=timings(ev.stats, spec)))
                if req.stream_options and req.stream_options.include_usage:
                    yield sse(
                        env(chunk=True, choices=[], usage=usage([ev.stats]), timings=timings(ev.stats, spec))
                    )
        yield "data: [DONE]\n\n"
    except LlamaspecError as e:
        yield sse_error(e)


def _logprobs(s: ServedModel, req: Sampling, r: Result) -> dict[str, Any] | None:
    """The ``logprobs`` of a whole response's choice: ``{"content": [...]}`` when asked for, else null."""
    if req.top_candidates() is None:
        return None
    return {"content": r.logprobs(s.model.token_to_piece, req.post_sampling_probs)}


def _pick(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """llama-server's response_fields: keep only these (a/b reaches into nested objects)."""
    if not fields:
        return body
    out = {}
    for f in fields:
        v: Any = body
        for part in f.split("/"):
            v = v.get(part) if isinstance(v, dict) else None
        out[f] = v
    return out


def create_app(
    cfg: ServerConfig,
    served: ServedModel | None = None,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The application for ``cfg``. Without ``served`` it loads the model at start-up (``/health``
    answers 503 until it is ready); a load that fails calls ``on_load_error`` (the command exits)."""
    state: dict[str, Any] = {"served": served, "load_error": None}

    async def load() -> None:
        try:
            model = await asyncio.to_thread(
                Model, cfg.model, n_gpu_layers=cfg.n_gpu_layers, rpc_servers=cfg.rpc_servers,
                rpc_timeout=cfg.rpc_timeout,
            )
            session, method, n_ctx_seq = await asyncio.to_thread(open_session, cfg, model)
            template = None
            if cfg.chat_template_file:
                with open(cfg.chat_template_file, encoding="utf-8") as f:
                    template = f.read()
            served = ServedModel(cfg, model, session, method, n_ctx_seq, template)
            await asyncio.to_thread(lambda: served.eog_ids)  # a scan of the vocabulary, off the loop
            state["served"] = served
            logger.info(
                "llamaspec serve: %s ready (%s, %d sequences of %d tokens) on http://%s:%d",
                cfg.model,
                method,
                cfg.n_seq,
                n_ctx_seq,
                cfg.host,
                cfg.port,
            )
        except Exception as e:  # reported by /health and every route until the command exits
            state["load_error"] = e
            if on_load_error is not None:
                on_load_error(e)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(load()) if state["served"] is None else None
        try:
            yield
        finally:
            if loader is not None and not loader.done():
                loader.cancel()
            s: ServedModel | None = state["served"]
            if s is not None:
                await asyncio.to_thread(s.close)

    app = FastAPI(
        title="llamaspec",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    def ready() -> ServedModel:
        s: ServedModel | None = state["served"]
        if s is None:
            if state["load_error"] is not None:
                raise ApiError(503, f"the model failed to load: {state['load_error']}")
            raise ApiError(503, "Loading model")
        return s

    # -- the front door (guard.py) and errors --------------------------------------------------------

    app.add_middleware(Guard, keys=cfg.api_key, cors_origins=cfg.cors_origins, webui=cfg.webui)
    if cfg.webui:
        add_webui(app)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, e: ApiError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(QueueFull)
    async def on_queue_full(request: Request, e: QueueFull) -> JSONResponse:
        return error_response(
            ApiError(503, "the server is busy: every sequence is in use and the queue is full")
        )

    @app.exception_handler(LlamaspecError)
    async def on_library_error(request: Request, e: LlamaspecError) -> JSONResponse:
        logger.error("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return error_response(ApiError(500, f"{type(e).__name__}: {e}", type="server_error"))

    @app.exception_handler(404)
    @app.exception_handler(405)
    async def on_no_route(request: Request, e: Exception) -> JSONResponse:
        return error_response(ApiError(404, f"no route {request.method} {request.url.path}"))

    # -- OpenAI: chat and text completions --------------------------------------------------------------

    @app.post("/chat/completions/input_tokens")
    @app.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request) -> dict[str, Any]:
        """How many tokens a chat request's prompt takes (without generating)."""
        s = ready()
        return {"input_tokens": len((await _chat_prompt(s, await _body(request, ChatRequest))).tokens)}

    @app.post("/chat/completions")
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        s = ready()
        req = await _body(request, ChatRequest)
        chat = await _chat_prompt(s, req)
        ids = list(chat.tokens)
        calls = s.plan(ids, req, req.n, chat=chat)
        env, spec = Envelope("chat.completion", req.model or cfg.model_id), s.method != "none"
        if not req.stream:
            done = await collect_all(request, s, calls)
            stats = [r.stats for r in done]
            choices = [
                {
                    "index": i,
                    "message": (r.message or ChatMessage(r.text)).to_dict(),
                    "finish_reason": finish_reason(r.stats, r.message),
                    "logprobs": _logprobs(s, req, r),
                }
                for i, r in enumerate(done)
            ]
            out = env(choices=choices, usage=usage(stats, one_prompt=True), timings=timings(stats[0], spec))
            if req.verbose:
                out["__verbose"] = {
                    "prompt": s.model.detokenize(ids, special=True),
                    "prompt_tokens": ids,
                    "params": calls[0].settings(),
                }
            return JSONResponse(out)
        if req.n != 1:
            raise ApiError(400, "a streamed chat completion takes n = 1")
        events = await start_stream(request, s, calls[0])
        return EventStream(_openai_stream(env, events, spec, req, _stream_tokens(s, req)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        s = ready()
        req = await _body(request, CompletionRequest)
        if req.n != 1:
            raise ApiError(400, "n > 1 is not supported on /v1/completions: send one request per choice")
        calls = [s.plan(ids, req)[0] for ids in await _completion_prompts(s, req.prompt_value())]
        env, spec = Envelope("text_completion", req.model or cfg.model_id), s.method != "none"
        if not req.stream:
            done = await collect_all(request, s, calls)
            stats = [r.stats for r in done]
            choices = [
                {
                    "index": i,
                    "text": r.text,
                    "logprobs": _logprobs(s, req, r),
                    "finish_reason": finish_reason(r.stats),
                }
                for i, r in enumerate(done)
            ]
            return JSONResponse(
                env(
                    choices=choices,
                    usage=usage(stats),
                    timings=timings(stats[0], spec) if len(stats) == 1 else None,
                )
            )
        if len(calls) != 1:
            raise ApiError(400, "a streamed completion takes one prompt")
        events = await start_stream(request, s, calls[0])
        return EventStream(_openai_stream(env, events, spec, req, _stream_tokens(s, req)))

    # -- llama-server's native completion --------------------------------------------------------------

    def native_final(
        s: ServedModel, call: Call, r: Result, req: CompletionRequest, stream: bool
    ) -> dict[str, Any]:
        st = r.stats
        out = {
            "index": 0,
            "content": r.text,
            "tokens": r.ids if req.return_tokens else [],
            "id_slot": st.seq,
            "stop": True,
            "model": cfg.model_id,
            "tokens_predicted": st.tokens,
            "tokens_evaluated": st.prompt_tokens,
            "generation_settings": call.settings() | {"speculative": s.method},
            "prompt": s.model.detokenize(call.ids, special=True),
            "has_new_line": "\n" in r.text,
            "truncated": False,
            "stop_type": "limit" if st.finish_reason == "length" else "eos" if r.eog else "word",
            "stopping_word": "",
            "tokens_cached": st.prompt_tokens + st.tokens,  # what the sequence holds after the call
            "timings": timings(st, s.method != "none"),
        }
        lp = None if stream else _logprobs(s, req, r)  # a stream sent them with its chunks
        if lp is not None:
            out["completion_probabilities"] = lp["content"]
        return out

    @app.post("/completion")
    @app.post("/completions")  # llama-server's alias of its native route (OpenAI's is /v1/completions)
    async def completion_native(request: Request) -> Response:
        """llama-server's own format: content, stop_type, tokens_predicted, timings...; its stream
        sends no [DONE]."""
        s = ready()
        req = await _body(request, CompletionRequest)
        calls = [s.plan(ids, req)[0] for ids in await _completion_prompts(s, req.prompt_value())]
        if not req.stream:
            done = await collect_all(request, s, calls)
            bodies = [
                _pick(native_final(s, c, r, req, stream=False) | {"index": i}, req.response_fields)
                for i, (c, r) in enumerate(zip(calls, done))
            ]
            return JSONResponse(bodies[0] if len(bodies) == 1 else bodies)
        if len(calls) != 1:
            raise ApiError(400, "a streamed completion takes one prompt")
        events = await start_stream(request, s, calls[0])

        async def body() -> AsyncIterator[str]:
            r = Result()
            tokens = _stream_tokens(s, req)
            partial = {"index": 0, "stop": False, "id_slot": -1}
            try:
                async for ev in events:
                    r.add(ev)
                    if isinstance(ev, PromptProgress):
                        yield sse({**partial, "content": "", "tokens": [], **progress(ev)})
                    elif isinstance(ev, Token):
                        taken = tokens.take(ev) if tokens is not None else None
                        if not ev.text:
                            continue
                        ids = [ev.id] if req.return_tokens else []
                        chunk = {**partial, "content": ev.text, "tokens": ids}
                        if taken is not None:
                            lp, extra = taken
                            if lp is not None:
                                chunk["completion_probabilities"] = lp
                            chunk.update(extra)
                        yield sse(chunk)
                    elif isinstance(ev, Done):
                        final = native_final(s, calls[0], r, req, stream=True) | {"content": ""}
                        yield sse(_pick(final, req.response_fields))
            except LlamaspecError as e:
                yield sse_error(e)

        return EventStream(body())

    # -- the model, its tokenizer and template; the server's state ---------------------------------------

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        ready()
        return {"status": "ok"}

    @app.get("/models")
    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        s = ready()
        m = s.model
        meta = {
            "n_ctx": s.n_ctx_seq,
            "n_ctx_train": m.n_ctx_train,
            "n_vocab": m.n_vocab,
            "n_embd": m.n_embd,
            "n_params": m.n_params,
            "size": m.size,
            "speculative": s.method,
        }
        return {
            "object": "list",
            "data": [
                {
                    "id": cfg.model_id,
                    "object": "model",
                    "created": int(s.started),
                    "owned_by": "llamaspec",
                    "meta": meta,
                }
            ],
            "models": [{"name": cfg.model_id, "model": cfg.model_id, "type": "model"}],
        }

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        s = ready()
        req = await _body(request, TokenizeRequest)
        ids = await asyncio.to_thread(s.model.tokenize, req.content, req.add_special, req.parse_special)
        if not req.with_pieces:
            return {"tokens": ids}
        out: list[dict[str, Any]] = []
        for i in ids:
            piece = s.model.token_to_piece(i, special=True)
            try:
                out.append({"id": i, "piece": piece.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": i, "piece": list(piece)})  # a partial character: its bytes
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        s = ready()
        req = await _body(request, DetokenizeRequest)
        s.check_ids(req.tokens)
        return {"content": await asyncio.to_thread(s.model.detokenize, req.tokens)}

    @app.post("/embeddings")
    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        """OpenAI's embeddings (ADR 0027): one vector per input, from the model's embedding context."""
        s = ready()
        req = await _body(request, EmbeddingRequest)
        inputs = req.inputs()

        def run() -> tuple[list[list[float]], int]:
            ids = [s.model.tokenize(x, add_special=True) if isinstance(x, str) else x for x in inputs]
            vectors = s.model.embed(ids, pooling=cfg.pooling, n_threads=cfg.n_threads)
            return vectors, sum(len(i) for i in ids)

        try:
            vectors, n_tokens = await asyncio.to_thread(run)
        except (InvalidOptionError, ContextOverflowError) as e:
            raise ApiError(400, str(e)) from None
        except UnsupportedModelError as e:
            raise ApiError(501, str(e), type="not_supported_error") from None
        return {
            "object": "list",
            "data": [embedding_data(i, v, req.encoding_format) for i, v in enumerate(vectors)],
            "model": req.model or cfg.model_id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict[str, Any]:
        s = ready()
        req = await _body(request, ChatRequest)
        return {"prompt": (await _chat_prompt(s, req)).text}

    @app.get("/props")
    async def props() -> dict[str, Any]:
        s = ready()
        return {
            "default_generation_settings": {
                "n_ctx": s.n_ctx_seq,
                "params": {"n_predict": cfg.n_predict, **cfg.sampling},
            },
            "total_slots": cfg.n_seq,
            "model_alias": cfg.model_id,
            "model_path": cfg.model,
            "chat_template": s.chat_template or s.model.chat_template or "",
            "build_info": f"llamaspec {__version__}",
            "speculative": {"method": s.method, "n_draft": cfg.n_draft},
        }

    @app.get("/slots")
    async def slots() -> list[dict[str, Any]]:
        s = ready()
        if not cfg.slots:
            raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`")
        out = []
        for sl in s.slots:
            item: dict[str, Any] = {
                "id": sl.id,
                "n_ctx": s.n_ctx_seq,
                "speculative": s.method != "none",
                "is_processing": sl.is_processing,
            }
            if sl.id_task >= 0:
                busy = sl.is_processing
                item |= {
                    "id_task": sl.id_task,
                    "n_prompt_tokens": sl.n_prompt_tokens,
                    "n_prompt_tokens_cache": sl.n_prompt_tokens_cache,
                    "params": sl.params,
                    "next_token": [
                        {
                            "has_next_token": busy,
                            "n_remain": sl.n_remain if busy else -1,
                            "n_decoded": sl.n_decoded if busy else 0,
                        }
                    ],
                }
            out.append(item)
        return out

    @app.get("/metrics")
    async def metrics() -> Response:
        s = ready()
        if not cfg.metrics:
            raise ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        response = Response(metrics_text(s), media_type="text/plain; version=0.0.4; charset=utf-8")
        response.raw_headers.append((b"Process-Start-Time-Unix", str(int(s.started)).encode()))
        return response

    return app
