"""Start and stop `llamaspec serve` (the installed console script) as a subprocess for the tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command() -> list[str]:
    """The installed console script next to this interpreter (what a user runs)."""
    exe = Path(sys.executable).parent / "llamaspec"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("llamaspec")
    if found is None:
        raise RuntimeError("the llamaspec console script is not installed")
    return [found]


class Server:
    """A running server: its base URL, process and log."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGINT, within: float = 5.0) -> float:
        """Send sig; returns the seconds it took to exit (raises if it did not within `within`)."""
        if self.proc.poll() is not None:
            return 0.0
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"the server did not exit within {within} s of signal {sig}:\n{self.log_text()}"
            )
        return time.monotonic() - t0


def start_server(
    model: str, *args: str, log_dir: Path, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Server:
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    cmd = [*serve_command(), "serve", model, "--port", str(port), *args]
    proc = subprocess.Popen(
        cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    server = Server(proc, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"llamaspec serve exited with {proc.returncode}:\n{server.log_text()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"llamaspec serve was not healthy within {timeout} s:\n{server.log_text()}")


@contextmanager
def running(model: str, *args: str, log_dir: Path) -> Iterator[Server]:
    server = start_server(model, *args, log_dir=log_dir)
    try:
        yield server
    finally:
        server.stop()
