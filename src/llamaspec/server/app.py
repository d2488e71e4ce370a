"""The ASGI application: routes, authentication, CORS, body limits and errors (ADR 0016).

Every route is ``async`` and never blocks the event loop on native work: tokenizing and templating run
in a worker thread, generation streams through ``ServedModel.generate`` (the engine wakes the loop per
event). Every error is ``{"error": {"code", "message", "type"}}`` with the status in server-spec.md.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.types import Receive, Scope, Send

from .. import __version__
from ..errors import ChatTemplateError, GrammarError, InvalidOptionError, LlamaspecError
from ..events import Done, EndOfGeneration, Event, GenerationStats, PromptProgress, Token
from ..model import Model
from .config import ServerConfig
from .engine import QueueFull, ServedModel, open_session
from .metrics import metrics_text
from .protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    Sampling,
    finish_reason,
    progress,
    timings,
    usage,
)

logger = logging.getLogger("llamaspec.server")

MAX_BODY = 8 * 1024 * 1024
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
LOCAL_ORIGIN_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _error_response(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


class _Stream(StreamingResponse):
    """A streaming response that notices a client going away at any time (also before the first
    token) and always closes its body iterator, so the request's call is cancelled and its sequence
    freed, whatever ended the response."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away mid-write
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


async def _chain(first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """first, then what rest yields; closing this closes rest (the call is cancelled)."""
    try:
        yield first
        if not isinstance(first, Done):
            async for ev in rest:
                yield ev
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


class Result:
    """A finished call: its text, token ids, whether the model stopped by itself, and its stats."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.ids: list[int] = []
        self.eog = False
        self._stats: GenerationStats | None = None

    def add(self, ev: Event) -> None:
        if isinstance(ev, Token):
            self.pieces.append(ev.text)
            self.ids.append(ev.id)
        elif isinstance(ev, EndOfGeneration):
            self.eog = True
        elif isinstance(ev, Done):
            self._stats = ev.stats

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def stats(self) -> GenerationStats:
        if self._stats is None:
            raise RuntimeError("the call ended without Done")
        return self._stats


def _origin_host(origin: str) -> str:
    rest = origin.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[: rest.find("]") + 1]
    return rest.split(":", 1)[0].split("/", 1)[0]


def create_app(cfg: ServerConfig, served: ServedModel | None = None) -> FastAPI:
    """The application for ``cfg``. Without ``served`` it loads the model at start-up (``/health``
    answers 503 until it is ready)."""
    state: dict[str, Any] = {"served": served, "load_error": None}
    keys = [k.encode() for k in cfg.api_key]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = None
        if state["served"] is None:
            loader = asyncio.create_task(_load())
        try:
            yield
        finally:
            if loader is not None and not loader.done():
                loader.cancel()
            s: ServedModel | None = state["served"]
            if s is not None:
                await asyncio.to_thread(s.close)

    async def _load() -> None:
        try:
            model = await asyncio.to_thread(Model, cfg.model, n_gpu_layers=cfg.n_gpu_layers)
            session, method, n_ctx_seq = await asyncio.to_thread(open_session, cfg, model)
            template = None
            if cfg.chat_template_file:
                with open(cfg.chat_template_file, encoding="utf-8") as f:
                    template = f.read()
            state["served"] = ServedModel(cfg, model, session, method, n_ctx_seq, template)
            logger.info(
                "llamaspec serve: %s ready (%s, %d sequences of %d tokens) on http://%s:%d",
                cfg.model,
                method,
                cfg.n_seq,
                n_ctx_seq,
                cfg.host,
                cfg.port,
            )
        except Exception as e:  # reported by /health and every route; the process stays up
            state["load_error"] = e
            logger.error("llamaspec serve: cannot load %s: %s", cfg.model, e)

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

    # -- middleware: CORS, authentication, body size -----------------------------------------------

    def allowed_origin(origin: str) -> bool:
        if cfg.cors_origins:
            return origin in cfg.cors_origins or "*" in cfg.cors_origins
        if keys:
            return True  # a key guards every route; reflect any origin, as llama-server does
        return _origin_host(origin) in LOCAL_ORIGIN_HOSTS

    def cors_headers(origin: str | None) -> dict[str, str]:
        if not origin or not allowed_origin(origin):
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Credentials": "true",
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": "*",
            "Vary": "Origin",
        }

    def with_cors(response: Response, origin: str | None) -> Response:
        # raw headers keep their case (some clients compare names case-sensitively)
        response.raw_headers.extend(
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in cors_headers(origin).items()
        )
        return response

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        origin = request.headers.get("origin")
        if request.method == "OPTIONS":
            return with_cors(Response(status_code=200 if cors_headers(origin) or not origin else 403), origin)
        response: Response
        try:
            if keys and request.url.path not in PUBLIC_PATHS:
                given = request.headers.get("authorization", "")
                token = (
                    given[7:].strip()
                    if given[:7].lower() == "bearer "
                    else request.headers.get("x-api-key", "")
                )
                if not any(hmac.compare_digest(token.encode(), k) for k in keys):
                    raise ApiError(401, "Invalid API Key")
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
                raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
            response = await call_next(request)
        except ApiError as e:
            response = _error_response(e)
        return with_cors(response, origin)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error_response(e)

    @app.exception_handler(QueueFull)
    async def on_queue_full(request: Request, e: QueueFull) -> JSONResponse:
        return _error_response(
            ApiError(503, "the server is busy: every sequence is in use and the queue is full")
        )

    @app.exception_handler(LlamaspecError)
    async def on_library_error(request: Request, e: LlamaspecError) -> JSONResponse:
        logger.error("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return _error_response(ApiError(500, f"{type(e).__name__}: {e}", type="server_error"))

    @app.exception_handler(404)
    async def on_not_found(request: Request, e: Exception) -> JSONResponse:
        return _error_response(ApiError(404, f"no route {request.method} {request.url.path}"))

    @app.exception_handler(405)
    async def on_bad_method(request: Request, e: Exception) -> JSONResponse:
        return _error_response(ApiError(404, f"no route {request.method} {request.url.path}"))

    async def body(request: Request, model: type[BaseModel]) -> Any:
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

    # -- shared generation plumbing ----------------------------------------------------------------

    def plan(s: ServedModel, ids: list[int], req: Sampling) -> tuple[int, dict[str, Any]]:
        """(max_tokens, sampling options) for a prompt, or an ApiError."""
        if not ids:
            raise ApiError(400, "the prompt is empty")
        if (
            req.speculative is not None
            and req.speculative.p_min is not None
            and req.speculative.p_min != cfg.p_min
        ):
            raise ApiError(
                501,
                "speculative.p_min per request is not supported yet (the server's is "
                f"{cfg.p_min}); speculative.n_max is",
            )
        room = s.n_ctx_seq - len(ids)
        if room <= 0:
            raise ApiError(
                400,
                f"the request exceeds the available context size ({len(ids)} prompt tokens, "
                f"context {s.n_ctx_seq} per sequence)",
                type="exceed_context_size_error",
                n_prompt_tokens=len(ids),
                n_ctx=s.n_ctx_seq,
            )
        limit = req.limit(cfg.n_predict)
        if limit == 0:
            raise ApiError(400, "max_tokens must be >= 1")
        if limit < 0 or limit > room:
            limit = room
        for i in ids:
            if not 0 <= i < s.model.n_vocab:
                raise ApiError(400, f"token id {i} is out of range")
        opts = req.options(cfg.sampling, s.model.n_vocab, s.model.tokenize)
        if req.ignore_eos:  # llama-server's field: end-of-generation tokens are never sampled
            opts["logit_bias"] = {**{t: -math.inf for t in s.eog_ids}, **opts.get("logit_bias", {})}
        if req.speculative is not None and req.speculative.n_max is not None:
            opts["draft_max"] = req.speculative.n_max  # a call option, not sampling: generate() takes it out
        return limit, opts

    async def run_call(s: ServedModel, ids: list[int], max_tokens: int, opts: dict[str, Any]) -> Result:
        """Run a call to its end (wrap in unless_disconnected: a client that leaves cancels it)."""
        r = Result()
        async for ev in s.generate(ids, max_tokens, opts):
            r.add(ev)
        return r

    async def collect(
        request: Request, s: ServedModel, ids: list[int], max_tokens: int, opts: dict[str, Any]
    ) -> Result:
        result: Result = await unless_disconnected(request, run_call(s, ids, max_tokens, opts))
        return result

    async def collect_all(
        request: Request, s: ServedModel, prompts: list[list[int]], plans: list[tuple[int, dict[str, Any]]]
    ) -> list[Result]:
        calls = asyncio.gather(*(run_call(s, ids, mt, o) for ids, (mt, o) in zip(prompts, plans)))
        results: list[Result] = await unless_disconnected(request, calls)
        return results

    def choice_plans(max_tokens: int, opts: dict[str, Any], n: int) -> list[tuple[int, dict[str, Any]]]:
        """One plan per choice: with a seed, choice i samples with seed + i (so choices differ and the
        request stays reproducible)."""
        if n == 1 or opts.get("seed") is None:
            return [(max_tokens, opts)] * n
        return [(max_tokens, {**opts, "seed": (opts["seed"] + i) % 0xFFFFFFFF}) for i in range(n)]

    async def start_stream(request: Request, agen: AsyncIterator[Event]) -> Event:
        """The first event of a stream, before the response starts: a full queue, a bad grammar or
        option is then an HTTP error, not an SSE one. A client that leaves meanwhile cancels it."""
        try:
            first: Event = await unless_disconnected(request, agen.__anext__())
        except BaseException:
            await agen.aclose()  # type: ignore[attr-defined]
            raise
        return first

    async def unless_disconnected(request: Request, aw: Awaitable[Any]) -> Any:
        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        task = asyncio.ensure_future(aw)
        watch = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not task.done() or task.cancelled():
            raise ApiError(499, "the client closed the request", type="cancelled")
        try:
            return task.result()
        except (GrammarError, InvalidOptionError, ChatTemplateError) as e:
            raise ApiError(400, str(e)) from None

    # -- routes ------------------------------------------------------------------------------------

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
        return {
            "object": "list",
            "data": [
                {
                    "id": cfg.model_id,
                    "object": "model",
                    "created": int(s.started),
                    "owned_by": "llamaspec",
                    "meta": {
                        "n_ctx": s.n_ctx_seq,
                        "n_ctx_train": m.n_ctx_train,
                        "n_vocab": m.n_vocab,
                        "n_embd": m.n_embd,
                        "n_params": m.n_params,
                        "size": m.size,
                        "speculative": s.method,
                    },
                }
            ],
            "models": [{"name": cfg.model_id, "model": cfg.model_id, "type": "model"}],
        }

    async def chat_ids(s: ServedModel, req: ChatRequest) -> list[int]:
        if req.continue_final_message:
            if req.add_generation_prompt:
                raise ApiError(400, "add_generation_prompt and continue_final_message cannot both be true")
            raise ApiError(501, "continue_final_message is not supported yet")
        kwargs = dict(req.chat_template_kwargs or {})

        def render() -> list[int]:
            return s.model.apply_chat_template(
                req.messages,
                tokenize=True,
                add_generation_prompt=req.add_generation_prompt,
                chat_template=s.chat_template,
                **kwargs,
            )

        try:
            return await asyncio.to_thread(render)
        except (ChatTemplateError, InvalidOptionError) as e:
            raise ApiError(400, str(e)) from None

    @app.post("/chat/completions/input_tokens")
    @app.post("/v1/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request) -> dict[str, Any]:
        """How many tokens a chat request's prompt takes (without generating)."""
        s = ready()
        req: ChatRequest = await body(request, ChatRequest)
        return {"input_tokens": len(await chat_ids(s, req))}

    @app.post("/chat/completions")
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        s = ready()
        req: ChatRequest = await body(request, ChatRequest)
        ids = await chat_ids(s, req)
        max_tokens, opts = plan(s, ids, req)
        cid, created, spec = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), s.method != "none"
        model_name = req.model or cfg.model_id
        if not req.stream:
            done = await collect_all(request, s, [ids] * req.n, choice_plans(max_tokens, opts, req.n))
            stats = [r.stats for r in done]
            out: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model_name,
                "system_fingerprint": f"llamaspec-{__version__}",
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": r.text},
                        "finish_reason": finish_reason(r.stats),
                        "logprobs": None,
                    }
                    for i, r in enumerate(done)
                ],
                "usage": usage(stats, one_prompt=True),
                "timings": timings(stats[0], spec),
            }
            if req.verbose:
                out["__verbose"] = {
                    "prompt": s.model.detokenize(ids, special=True),
                    "prompt_tokens": ids,
                    "params": {"n_predict": max_tokens, **opts},
                }
            return JSONResponse(out)
        if req.n != 1:
            raise ApiError(400, "a streamed chat completion takes n = 1")

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "system_fingerprint": f"llamaspec-{__version__}",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
                **extra,
            }

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        agen = s.generate(ids, max_tokens, opts, progress=req.return_progress)
        first = await start_stream(request, agen)

        async def events() -> AsyncIterator[str]:
            try:
                yield _sse(chunk({"role": "assistant", "content": None}))
                async for ev in _chain(first, agen):
                    if isinstance(ev, PromptProgress):
                        yield _sse(
                            {
                                "id": cid,
                                "object": "chat.completion.chunk",
                                "created": created,
                                "model": model_name,
                                "choices": [],
                                **progress(ev),
                            }
                        )
                    elif isinstance(ev, Token):
                        if ev.text:
                            yield _sse(chunk({"content": ev.text}))
                    elif isinstance(ev, Done):
                        st = ev.stats
                        yield _sse(chunk({}, finish_reason(st), timings=timings(st, spec)))
                        if include_usage:
                            yield _sse(
                                {
                                    "id": cid,
                                    "object": "chat.completion.chunk",
                                    "created": created,
                                    "model": model_name,
                                    "choices": [],
                                    "usage": usage([st]),
                                    "timings": timings(st, spec),
                                }
                            )
                yield "data: [DONE]\n\n"
            except LlamaspecError as e:
                status = 400 if isinstance(e, (GrammarError, InvalidOptionError)) else 500
                yield _sse(ApiError(status, str(e)).body())

        return _Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def completion_prompts(s: ServedModel, prompt: Any) -> list[list[int]]:
        """Token ids of each prompt: a str (special tokens parsed, as llama-server does), token ids,
        ``{"prompt_string": str}``, or a list of those (one completion each)."""

        def one(p: Any) -> list[int]:
            if isinstance(p, dict):
                if p.get("multimodal_data"):
                    raise ApiError(501, "this model takes no images or audio (multimodal_data)")
                p = p.get("prompt_string")
            if isinstance(p, str):
                return s.model.tokenize(p, add_special=True, parse_special=True)
            if isinstance(p, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
                return list(p)
            raise ApiError(
                400, 'prompt: expected a string, token ids, {"prompt_string": ...} or a list of them'
            )

        def mixed(items: list[Any]) -> list[int]:  # ids and strings in one prompt, concatenated
            out: list[int] = []
            for k, x in enumerate(items):
                if isinstance(x, str):
                    out += s.model.tokenize(x, add_special=k == 0, parse_special=True)
                else:
                    out.append(x)
            return out

        if isinstance(prompt, list) and prompt and not all(isinstance(x, int) for x in prompt):
            if all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in prompt) and any(
                isinstance(x, int) for x in prompt
            ):
                return [await asyncio.to_thread(mixed, prompt)]
            return [await asyncio.to_thread(one, p) for p in prompt]
        return [await asyncio.to_thread(one, prompt)]

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        s = ready()
        req: CompletionRequest = await body(request, CompletionRequest)
        prompts = await completion_prompts(s, req.prompt_value())
        if req.n != 1:
            raise ApiError(400, "n > 1 is not supported: send one request per choice")
        plans = [plan(s, ids, req) for ids in prompts]
        cid, created, spec = f"cmpl-{uuid.uuid4().hex}", int(time.time()), s.method != "none"
        model_name = req.model or cfg.model_id
        if not req.stream:
            done = await collect_all(request, s, prompts, plans)
            results = [(r.text, r.stats) for r in done]
            total = [st for _, st in results]
            return JSONResponse(
                {
                    "id": cid,
                    "object": "text_completion",
                    "created": created,
                    "model": model_name,
                    "system_fingerprint": f"llamaspec-{__version__}",
                    "choices": [
                        {"index": i, "text": text, "logprobs": None, "finish_reason": finish_reason(st)}
                        for i, (text, st) in enumerate(results)
                    ],
                    "usage": usage(total),
                    "timings": timings(total[0], spec) if len(total) == 1 else None,
                }
            )
        if len(prompts) != 1:
            raise ApiError(400, "a streamed completion takes one prompt")
        ids, (max_tokens, opts) = prompts[0], plans[0]
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(text: str, finish: str | None = None, **extra: Any) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model_name,
                "system_fingerprint": f"llamaspec-{__version__}",
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                **extra,
            }

        agen = s.generate(ids, max_tokens, opts, progress=req.return_progress)
        first = await start_stream(request, agen)

        async def events() -> AsyncIterator[str]:
            try:
                async for ev in _chain(first, agen):
                    if isinstance(ev, PromptProgress):
                        yield _sse(
                            {
                                "id": cid,
                                "object": "text_completion",
                                "created": created,
                                "model": model_name,
                                "choices": [],
                                **progress(ev),
                            }
                        )
                    elif isinstance(ev, Token):
                        if ev.text:
                            yield _sse(chunk(ev.text))
                    elif isinstance(ev, Done):
                        st = ev.stats
                        yield _sse(chunk("", finish_reason(st), timings=timings(st, spec)))
                        if include_usage:
                            yield _sse(
                                {
                                    "id": cid,
                                    "object": "text_completion",
                                    "created": created,
                                    "model": model_name,
                                    "choices": [],
                                    "usage": usage([st]),
                                    "timings": timings(st, spec),
                                }
                            )
                yield "data: [DONE]\n\n"
            except LlamaspecError as e:
                status = 400 if isinstance(e, (GrammarError, InvalidOptionError)) else 500
                yield _sse(ApiError(status, str(e)).body())

        return _Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def native_final(
        s: ServedModel,
        ids: list[int],
        max_tokens: int,
        opts: dict[str, Any],
        r: Result,
        slot: int,
        want_tokens: bool,
    ) -> dict[str, Any]:
        st = r.stats
        stop_type = "limit" if st.finish_reason == "length" else "eos" if r.eog else "word"
        return {
            "index": 0,
            "content": r.text,
            "tokens": r.ids if want_tokens else [],
            "id_slot": slot,
            "stop": True,
            "model": cfg.model_id,
            "tokens_predicted": st.tokens,
            "tokens_evaluated": st.prompt_tokens,
            "generation_settings": {"n_predict": max_tokens, **opts, "speculative": s.method},
            "prompt": s.model.detokenize(ids, special=True),
            "has_new_line": "\n" in r.text,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": "",
            "tokens_cached": 0,
            "timings": timings(st, s.method != "none"),
        }

    def pick(body: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
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

    @app.post("/completion")
    @app.post("/completions")  # llama-server's alias of its native route (OpenAI's is /v1/completions)
    async def completion_native(request: Request) -> Response:
        """llama-server's own format: content, stop_type, tokens_predicted, timings...; its stream sends
        no [DONE]."""
        s = ready()
        req: CompletionRequest = await body(request, CompletionRequest)
        prompts = await completion_prompts(s, req.prompt_value())
        plans = [plan(s, ids, req) for ids in prompts]
        if not req.stream:
            done = await collect_all(request, s, prompts, plans)
            bodies = [
                pick(native_final(s, ids, mt, o, r, r.stats.seq, req.return_tokens), req.response_fields)
                for ids, (mt, o), r in zip(prompts, plans, done)
            ]
            for i, b in enumerate(bodies):
                if "index" in b:
                    b["index"] = i
            return JSONResponse(bodies[0] if len(bodies) == 1 else bodies)
        if len(prompts) != 1:
            raise ApiError(400, "a streamed completion takes one prompt")
        ids, (max_tokens, opts) = prompts[0], plans[0]
        agen = s.generate(ids, max_tokens, opts, progress=req.return_progress)
        first = await start_stream(request, agen)

        async def events() -> AsyncIterator[str]:
            r = Result()
            try:
                async for ev in _chain(first, agen):
                    r.add(ev)
                    if isinstance(ev, PromptProgress):
                        yield _sse(
                            {
                                "index": 0,
                                "content": "",
                                "tokens": [],
                                "stop": False,
                                "id_slot": -1,
                                **progress(ev),
                            }
                        )
                    elif isinstance(ev, Token) and ev.text:
                        yield _sse(
                            {
                                "index": 0,
                                "content": ev.text,
                                "tokens": [ev.id] if req.return_tokens else [],
                                "stop": False,
                                "id_slot": -1,
                            }
                        )
                    elif isinstance(ev, Done):
                        yield _sse(
                            pick(
                                native_final(s, ids, max_tokens, opts, r, ev.stats.seq, req.return_tokens)
                                | {"content": ""},
                                req.response_fields,
                            )
                        )
            except LlamaspecError as e:
                status = 400 if isinstance(e, (GrammarError, InvalidOptionError)) else 500
                yield _sse(ApiError(status, str(e)).body())

        return _Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        s = ready()
        obj = await body(request, _TokenizeRequest)
        ids = await asyncio.to_thread(s.model.tokenize, obj.content, obj.add_special, obj.parse_special)
        if not obj.with_pieces:
            return {"tokens": ids}
        out = []
        for i in ids:
            piece = s.model.token_to_piece(i, special=True)
            try:
                out.append({"id": i, "piece": piece.decode("utf-8")})
            except UnicodeDecodeError:
                out.append({"id": i, "piece": list(piece)})
        return {"tokens": out}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        s = ready()
        obj = await body(request, _DetokenizeRequest)
        for i in obj.tokens:
            if not 0 <= i < s.model.n_vocab:
                raise ApiError(400, f"token id {i} is out of range")
        return {"content": await asyncio.to_thread(s.model.detokenize, obj.tokens)}

    @app.post("/apply-template")
    async def apply_template(request: Request) -> dict[str, Any]:
        s = ready()
        req: ChatRequest = await body(request, ChatRequest)

        def render() -> str:
            return s.model.apply_chat_template(
                req.messages,
                tokenize=False,
                add_generation_prompt=req.add_generation_prompt,
                chat_template=s.chat_template,
                **(req.chat_template_kwargs or {}),
            )

        try:
            text = await asyncio.to_thread(render)
        except (ChatTemplateError, InvalidOptionError) as e:
            raise ApiError(400, str(e)) from None
        return {"prompt": text}

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
                item.update(
                    {
                        "id_task": sl.id_task,
                        "n_prompt_tokens": sl.n_prompt_tokens,
                        "n_prompt_tokens_cache": 0,
                        "params": sl.params,
                        "next_token": [
                            {
                                "has_next_token": sl.is_processing,
                                "n_remain": sl.n_remain if sl.is_processing else -1,
                                "n_decoded": sl.n_decoded if sl.is_processing else 0,
                            }
                        ],
                    }
                )
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


class _TokenizeRequest(BaseModel):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class _DetokenizeRequest(BaseModel):
    tokens: list[int]
