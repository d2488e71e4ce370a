"""Load: 16 concurrent streaming clients for 60 s against `llamaspec serve -np 4`, one request in five
dropped mid-stream by its client. Every completed response equals that prompt's response alone
(greedy), no request is lost, no sequence leaks, memory stays flat; time to first token is reported."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from pathlib import Path

import httpx
import pytest

from .conftest import proc_status
from .server_util import running

pytestmark = pytest.mark.real_model

PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "List three colors:",
    "Once upon a time",
    "The best way to learn is",
]
MAX_TOKENS = 32
CLIENTS = 16
SECONDS = 60.0


async def stream_once(
    h: httpx.AsyncClient, url: str, prompt: str, drop_after: int | None
) -> tuple[str, float, bool]:
    """(text, seconds to the first token, completed) of one streamed completion."""
    t0 = time.monotonic()
    ttft = -1.0
    text = []
    n = 0
    async with h.stream(
        "POST",
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True},
    ) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "".join(text), ttft, True
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"] and chunk["choices"][0]["text"]:
                if ttft < 0:
                    ttft = time.monotonic() - t0
                text.append(chunk["choices"][0]["text"])
                n += 1
                if drop_after is not None and n >= drop_after:
                    return "".join(text), ttft, False  # leaving the block closes the connection
    raise AssertionError("the stream ended without [DONE]")


def test_sixteen_clients_for_a_minute(
    smol_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running(
        smol_path, "-np", "4", "-c", "4096", "-t", "2", "--method", "none", "--queue", "64", log_dir=tmp_path
    ) as server:
        url = server.url

        async def main() -> tuple[dict[str, str], list[tuple[str, str, float, bool]], int, int]:
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as h:
                alone = {p: (await stream_once(h, url, p, None))[0] for p in PROMPTS}
                results: list[tuple[str, str, float, bool]] = []
                rss: list[int] = []
                rng = random.Random(7)
                end = time.monotonic() + SECONDS

                async def client_loop() -> None:
                    while time.monotonic() < end:
                        p = rng.choice(PROMPTS)
                        drop = rng.randint(1, MAX_TOKENS // 2) if rng.random() < 0.2 else None
                        text, ttft, done = await stream_once(h, url, p, drop)
                        results.append((p, text, ttft, done))

                async def sample_rss() -> None:
                    await asyncio.sleep(SECONDS / 4)  # after warm-up
                    rss.append(proc_status("VmRSS", server.proc.pid))

                await asyncio.gather(sample_rss(), *(client_loop() for _ in range(CLIENTS)))
                return alone, results, rss[0], proc_status("VmRSS", server.proc.pid)

        alone, results, rss_warm, rss_end = asyncio.run(main())
        done = [r for r in results if r[3]]
        dropped = [r for r in results if not r[3]]
        assert len(done) > 50 and dropped, (len(done), len(dropped))
        for p, text, _, _ in done:
            assert text == alone[p], p
        for p, text, _, _ in dropped:
            assert alone[p].startswith(text), p
        deadline = time.monotonic() + 5
        while any(s["is_processing"] for s in httpx.get(f"{url}/slots").json()):
            assert time.monotonic() < deadline, "a sequence is still busy after the load"
            time.sleep(0.05)
        ttfts = sorted(r[2] for r in done)
        p50 = statistics.median(ttfts)
        p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
        with capsys.disabled():
            print(
                f"\nload: {len(done)} completed, {len(dropped)} dropped by their clients in {SECONDS:.0f} s, "
                f"{CLIENTS} clients, -np 4; time to first token p50 {p50 * 1e3:.0f} ms, "
                f"p99 {p99 * 1e3:.0f} ms; "
                f"RSS {rss_warm} KiB after warm-up, {rss_end} KiB at the end"
            )
        assert rss_end < rss_warm * 1.05, (rss_warm, rss_end)
