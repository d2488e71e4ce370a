"""Error paths of the server that no HTTP client can provoke on a healthy model: the engine fails in
the middle of a call (an injected native fault). In process (httpx's ASGI transport) because the fault
is armed in this process; tests/test_server.py covers the server as a user runs it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import llamaspec
from llamaspec.server import ServerConfig, create_app
from llamaspec.server.engine import ServedModel




def served(smol: llamaspec.Model) -> ServedModel:
    cfg = ServerConfig(model="smol.gguf", n_seq=2, n_ctx=1024, metrics=True)
    session = llamaspec.Generator(smol, n_seq=2, n_ctx=512, n_threads=2)
    return ServedModel(cfg, smol, session, "none", 512, None)


async def post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as h:
        return await h.post(path, json=body, timeout=60)


@pytest.mark.real_model
def test_an_engine_failure_mid_stream_is_an_sse_error_event(smol: llamaspec.Model, armed_fault: Any) -> None:
    s = served(smol)
    try:
        app = create_app(s.cfg, s)
        body = {"prompt": "The capital of France is", "max_tokens": 32, "temperature": 0, "stream": True,
                "ignore_eos": True}
        armed_fault("throw_unknown", 4)
        r = asyncio.run(post(app, "/v1/completions", body))
        assert r.status_code == 200  # the stream had started
        events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        assert any(e.get("choices") and e["choices"][0]["text"] for e in events)
        assert events[-1]["error"]["code"] == 500 and "unknown" in events[-1]["error"]["message"]
        assert "[DONE]" not in r.text
        # not streamed: a 500 in the error format; the server goes on
        armed_fault("throw_unknown", 3)
        r = asyncio.run(post(app, "/v1/completions", {**body, "stream": False}))
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        r = asyncio.run(post(app, "/v1/completions", {**body, "stream": False, "max_tokens": 4}))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert s.processing == 0 and s.waiting == 0
    finally:
        s.session.close()


@pytest.mark.unit
def test_the_piece_writer_writes_the_chunk_json() -> None:
    """The per-token fast path renders the same JSON as the general chunk."""
    from llamaspec.server.protocol import Envelope
    from llamaspec.server.streaming import sse

    for obj in ("chat.completion", "text_completion"):
        env = Envelope(obj, 'a "model" \x00piece\x00')
        write = env.piece_writer()
        for text in ("hello", "", 'quote " and \\ and \n', "\x00piece\x00", "ünïcødé ✓ 🚀"):
            if obj == "chat.completion":
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": None, "logprobs": None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
            want = sse(env(chunk=True, choices=[choice]))
            assert write(text) == want
            assert json.loads(write(text)[6:]) == json.loads(want[6:])
