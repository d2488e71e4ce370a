"""Running a call for a request: to its end (non-streamed) or as a stream of events, cancelled as soon
as the client goes away (ADR 0016, "Cancellation").

- ``unless_disconnected(request, aw)`` races an awaitable against the client's disconnect.
- ``collect_all`` runs calls to their ends (one request, several prompts or choices).
- ``start_stream`` awaits a stream's start (the call's first prompt-progress event, which comes
  before its prompt is decoded) before the response starts, so that a full queue, a bad grammar or
  option is an HTTP status rather than an SSE error, and the response's headers are on their way
  while the prompt decodes.
- ``EventStream`` is the streamed response: it notices a disconnect at any time and always closes
  its body iterator, which cancels the call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..errors import ChatTemplateError, GrammarError, InvalidOptionError, LlamaspecError
from ..events import ChatMessage, Done, EndOfGeneration, Event, GenerationStats, PromptProgress, Token
from .engine import Call, ServedModel
from .protocol import ApiError, token_logprobs


def sse(obj: Any) -> str:
    """One server-sent event carrying obj as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_error(e: LlamaspecError) -> str:
    """An error after a stream started: an SSE event with the error object (openai-python raises it)."""
    status = 400 if isinstance(e, (GrammarError, InvalidOptionError)) else 500
    return sse(ApiError(status, str(e)).body())


class EventStream(StreamingResponse):
    """A text/event-stream response that notices the client going away at any time (also before the
    first token) and always closes its body iterator, so the call is cancelled and its sequence
    freed, whatever ended the response."""

    def __init__(self, content: AsyncIterator[str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

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


class Result:
    """A finished call: its text, token ids, whether the model stopped by itself, its stats and (a
    chat call) its parsed reply."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.ids: list[int] = []
        self.tokens: list[Token] = []
        self.eog = False
        self.message: ChatMessage | None = None  # a chat call's parsed reply
        self._stats: GenerationStats | None = None

    def add(self, ev: Event) -> None:
        """Fold one event in."""
        if isinstance(ev, Token):
            self.pieces.append(ev.text)
            self.ids.append(ev.id)
            self.tokens.append(ev)
        elif isinstance(ev, EndOfGeneration):
            self.eog = True
        elif isinstance(ev, Done):
            self._stats = ev.stats
            self.message = ev.message

    def logprobs(self, piece: Callable[[int], bytes], post_sampling: bool) -> list[dict[str, Any]]:
        """Each token's log-probabilities (protocol.token_logprobs) up to the last one whose text
        is in the output (a stop string's tokens are not)."""
        last = max((i for i, t in enumerate(self.tokens) if t.text), default=-1)
        return [token_logprobs(t, piece(t.id), post_sampling) for t in self.tokens[: last + 1]]

    @property
    def text(self) -> str:
        """The generated text."""
        return "".join(self.pieces)

    @property
    def stats(self) -> GenerationStats:
        """The call's figures (after Done)."""
        if self._stats is None:
            raise RuntimeError("the call ended without Done")
        return self._stats


async def unless_disconnected(request: Request, aw: Awaitable[Any]) -> Any:
    """aw's result; a client that disconnects first cancels aw (ApiError 499, which nobody reads).
    Library errors a request caused become 400."""

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
    if task.cancelled():
        raise ApiError(499, "the client closed the request", type="cancelled")
    try:
        return task.result()
    except (GrammarError, InvalidOptionError, ChatTemplateError) as e:
        raise ApiError(400, str(e)) from None


async def _run(s: ServedModel, call: Call) -> Result:
    r = Result()
    async for ev in s.generate(call):
        r.add(ev)
    return r


async def collect_all(request: Request, s: ServedModel, calls: list[Call]) -> list[Result]:
    """Run calls together to their ends; a client that leaves cancels them all."""
    results: list[Result] = await unless_disconnected(request, asyncio.gather(*(_run(s, c) for c in calls)))
    return results


async def start_stream(request: Request, s: ServedModel, call: Call) -> AsyncIterator[Event]:
    """The call's events once it has started (queue wait and checks passed): its first event, a
    PromptProgress that the engine sends before decoding the prompt, is already there. Progress
    events reach the caller only when the call asked for them."""
    agen = s.generate(call, announce=True)
    try:
        first: Event = await unless_disconnected(request, agen.__anext__())
    except BaseException:
        await agen.aclose()  # type: ignore[attr-defined]
        raise
    return _chain(first, agen, call.progress)


async def _chain(first: Event, rest: AsyncIterator[Event], progress: bool) -> AsyncIterator[Event]:
    """first, then what rest yields, PromptProgress events only with ``progress``; closing this
    closes rest (the call is cancelled)."""
    try:
        if progress or not isinstance(first, PromptProgress):
            yield first
        if not isinstance(first, Done):
            async for ev in rest:
                if progress or not isinstance(ev, PromptProgress):
                    yield ev
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
