"""llama.cpp's RPC backend over loopback: a model's layers on `llamaspec rpc-server` workers started
by the tests. Output equals the local run token for token (plain, MTP, a draft model, the server);
every fault is a typed error and the process survives it."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from llamaspec_fixtures import FixtureInfo, write_dflash_fixture, write_eagle3_fixture

import llamaspec
from llamaspec import BackendError, InvalidOptionError, ModelLoadError

from .conftest import token_ids
from .server_util import free_port, running, serve_command

PROMPT = "The three primary colors are"


def _die_with_the_tests() -> None:
    """In the worker, before exec: SIGKILL when the test process dies, so that a test run that
    crashes leaves no worker behind (Linux's PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


class Worker:
    """A `llamaspec rpc-server` process on a loopback port."""

    def __init__(self, log_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = log_dir / f"rpc-{self.port}-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [*serve_command(), "rpc-server", "--host", host, "--port", str(self.port), "--threads", "1"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, preexec_fn=_die_with_the_tests,
        )
        deadline = time.monotonic() + 30
        while True:  # ready once it accepts a connection (it serves the next client after this one)
            assert self.proc.poll() is None, f"rpc-server exited:\n{self.log.read_text()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "rpc-server did not listen within 30 s"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test stopped it
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    """Two workers, stopped after the test whatever happened."""
    started = [Worker(tmp_path), Worker(tmp_path)]
    try:
        yield started
    finally:
        for w in started:
            w.stop()


def greedy(model: llamaspec.Model, n: int = 40, **session: object) -> list[int]:
    with llamaspec.Generator(model, n_ctx=512, n_threads=1, **session) as g:  # type: ignore[arg-type]
        return token_ids(g.stream_events(PROMPT, n, temperature=0))


def test_two_workers_share_the_layers_and_greedy_equals_local(
    smol_path: str, workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    with llamaspec.Model(smol_path) as local:
        want = greedy(local)
        with llamaspec.Generator(local, n_ctx=512, n_threads=1) as g:
            seeded_want = token_ids(g.stream_events(PROMPT, 40, temperature=0.8, seed=7))
    with caplog.at_level(logging.INFO, logger="llamaspec.llama_cpp"):
        remote = llamaspec.Model(smol_path, rpc_servers=[w.endpoint for w in workers])
        remote_greedy = greedy(remote)
    loaded = caplog.text
    assert "offloaded 31/31 layers" in loaded  # every layer and the output: the default with workers
    for w in workers:  # each worker holds weights and KV rows
        assert re.search(rf"\[{re.escape(w.endpoint)}\] model buffer size = +[1-9]", loaded), loaded
        assert re.search(rf"\[{re.escape(w.endpoint)}\] KV buffer size = +[1-9]", loaded), loaded
    with remote:
        assert remote_greedy == want
        with llamaspec.Generator(remote, n_ctx=512, n_threads=1) as g:
            assert token_ids(g.stream_events(PROMPT, 40, temperature=0.8, seed=7)) == seeded_want
        # speculation over the split model is lossless too: a draft model kept local
        with llamaspec.Model(smol_path) as draft, llamaspec.Speculative(
            remote, draft_model=draft, method="draft", n_draft=4, n_ctx=512, n_threads=1
        ) as spec:
            assert token_ids(spec.stream_events(PROMPT, 40, temperature=0)) == want
            assert spec.stats().drafts_accepted > 0


def test_mtp_over_rpc_equals_local_plain(
    fx_mtp_levels: dict[str, FixtureInfo], workers: list[Worker]
) -> None:
    info = fx_mtp_levels["74"]
    prompt = "hello"
    with llamaspec.Model(info.path) as local, llamaspec.Generator(local, n_ctx=512, n_threads=1) as g:
        want = token_ids(g.stream_events(prompt, 100, temperature=0))
    with llamaspec.Model(info.path, rpc_servers=[w.endpoint for w in workers]) as remote, llamaspec.MTP(
        remote, n_draft=3, n_ctx=512, n_threads=1
    ) as mtp:
        assert token_ids(mtp.stream_events(prompt, 100, temperature=0)) == want
        assert mtp.stats().drafts_accepted > 0


def test_every_drafter_over_a_split_target(
    fx_nomtp_info: FixtureInfo, fixture_dir: Path, workers: list[Worker]
) -> None:
    # the heads that read the target's hidden states (EAGLE-3, DFlash) and n-gram, on a target whose
    # every layer is on the workers: each equals the local plain run. The EAGLE-3 fixture has no
    # output layer of its own and computes with the target's, so it goes on the same workers; kept
    # local it is refused (ggml would abort the first decode: a local context cannot run the
    # workers' weights). The DFlash fixture has its own and stays local.
    prompt = "hello"
    endpoints = [w.endpoint for w in workers]
    with llamaspec.Model(fx_nomtp_info.path) as local, \
            llamaspec.Generator(local, n_ctx=512, n_threads=1) as g:
        want = token_ids(g.stream_events(prompt, 60, temperature=0))
    eagle3 = write_eagle3_fixture(fixture_dir / "rpc-eagle3.gguf", fx_nomtp_info, wrong_fraction=0.3)
    dflash = write_dflash_fixture(fixture_dir / "rpc-dflash.gguf", fx_nomtp_info, wrong_fraction=0.3)
    with llamaspec.Model(fx_nomtp_info.path, rpc_servers=endpoints) as remote:
        with llamaspec.Model(eagle3.path) as kept_local, \
                pytest.raises(InvalidOptionError, match="rpc_servers"):
            llamaspec.Speculative(remote, method="eagle3", draft_model=kept_local, n_ctx=512)
        for kind, path, where in (("eagle3", eagle3.path, endpoints), ("dflash", dflash.path, None)):
            with llamaspec.Model(path, rpc_servers=where) as dm, llamaspec.Speculative(
                remote, method=kind, draft_model=dm, n_draft=3, n_ctx=512, n_threads=1
            ) as spec:
                assert token_ids(spec.stream_events(prompt, 60, temperature=0)) == want, kind
                assert spec.stats().drafts_accepted > 0, kind
        with llamaspec.Speculative(remote, method="ngram-simple", n_draft=3, n_ctx=512, n_threads=1) as spec:
            assert token_ids(spec.stream_events(prompt, 60, temperature=0)) == want


@pytest.mark.parametrize("bad", ["localhost", "127.0.0.1:", ":50052", "127.0.0.1:0", "127.0.0.1:70000",
                                 "127.0.0.1:50x52", "http://127.0.0.1:50052", "a b:1"])
def test_malformed_endpoint(smol_path: str, bad: str) -> None:
    with pytest.raises(InvalidOptionError, match="host:port"):
        llamaspec.Model(smol_path, rpc_servers=[bad])


@pytest.mark.parametrize("bad", ["127.0.0.1:50052", [1], 42])
def test_rpc_servers_must_be_a_list_of_strings(smol_path: str, bad: object) -> None:
    with pytest.raises(InvalidOptionError, match="rpc_servers"):
        llamaspec.Model(smol_path, rpc_servers=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1.0, "2", float("nan"), float("inf"), 1e9, True])
@pytest.mark.parametrize("servers", [["127.0.0.1:1"], None])
def test_invalid_rpc_timeout(smol_path: str, bad: object, servers: list[str] | None) -> None:
    with pytest.raises(InvalidOptionError, match="rpc_timeout"):
        llamaspec.Model(smol_path, rpc_servers=servers, rpc_timeout=bad)  # type: ignore[arg-type]


def test_a_worker_named_twice(smol_path: str) -> None:
    with pytest.raises(InvalidOptionError, match="twice"):
        llamaspec.Model(smol_path, rpc_servers=["127.0.0.1:50052", "127.0.0.1:50052"])


def test_unreachable_worker_is_a_load_error_naming_it(smol_path: str) -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(ModelLoadError, match=endpoint):
        llamaspec.Model(smol_path, rpc_servers=[endpoint])
    assert time.monotonic() - t0 < 10


def test_worker_killed_mid_generation(smol_path: str, tmp_path: Path) -> None:
    local = llamaspec.Model(smol_path)
    want = greedy(local, 30)
    worker = Worker(tmp_path)
    try:
        model = llamaspec.Model(smol_path, rpc_servers=[worker.endpoint], rpc_timeout=2)
        g = llamaspec.Generator(model, n_ctx=512, n_threads=1)
        got: list[int] = []
        with pytest.raises(BackendError, match=worker.endpoint):
            for i, piece in enumerate(g.stream_events(PROMPT, 400, temperature=0)):
                if isinstance(piece, llamaspec.Token):
                    got.append(piece.id)
                if i == 5:
                    worker.proc.kill()
                    worker.proc.wait()
        assert got == want[: len(got)]  # nothing wrong reached the caller before the error
        # the model stays failed: every later call, and a new session, raise BackendError
        with pytest.raises(BackendError):
            g.generate(PROMPT, 5, temperature=0)
        with pytest.raises(BackendError):
            llamaspec.Generator(model, n_ctx=512, n_threads=1)
        # a worker back on the same port serves a new Model
        worker = Worker(tmp_path, port=worker.port)
        with pytest.raises(BackendError):  # not the old one: its weights were on the dead worker
            g.generate(PROMPT, 5, temperature=0)
        g.close()
        model.close()
        with llamaspec.Model(smol_path, rpc_servers=[worker.endpoint]) as fresh:
            assert greedy(fresh, 30) == want
    finally:
        worker.stop()
        local.close()


def test_hung_worker_ends_the_call_within_rpc_timeout(smol_path: str, workers: list[Worker]) -> None:
    # two workers (llama.cpp then pipelines the split with events), the second one stopped: the call
    # ends once, one timeout after, not one timeout per event
    with llamaspec.Model(smol_path, rpc_servers=[w.endpoint for w in workers], rpc_timeout=2) as model, \
            llamaspec.Generator(model, n_ctx=512, n_threads=1) as g:
        t_stop = 0.0
        with pytest.raises(BackendError, match=workers[1].endpoint):
            for i, _ in enumerate(g.stream_events(PROMPT, 400, temperature=0)):
                if i == 3:
                    os.kill(workers[1].proc.pid, signal.SIGSTOP)
                    t_stop = time.monotonic()
        waited = time.monotonic() - t_stop
        assert 1.5 < waited < 4.5, waited
        with pytest.raises(BackendError):  # and at once from then on
            t0 = time.monotonic()
            g.generate(PROMPT, 5, temperature=0)
        assert time.monotonic() - t0 < 1.5


def test_worker_bound_by_host_name(smol_path: str, tmp_path: Path) -> None:
    worker = Worker(tmp_path, host="localhost")  # resolved to 127.0.0.1 (ggml binds IPv4 addresses)
    try:
        with llamaspec.Model(smol_path, rpc_servers=[worker.endpoint]) as model:
            assert len(greedy(model, 8)) == 8
    finally:
        worker.stop()


def test_rpc_server_command(tmp_path: Path) -> None:
    out = subprocess.run([*serve_command(), "rpc-server", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0
    assert "no authentication" in " ".join(out.stdout.split()) and "127.0.0.1" in out.stdout
    bad = subprocess.run([*serve_command(), "rpc-server", "--port", "0"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--port" in bad.stderr
    # a port that is taken: one line and exit 1, no crash
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        busy = subprocess.run([*serve_command(), "rpc-server", "--port", str(taken)], capture_output=True,
                              text=True, timeout=60)
    assert busy.returncode == 1 and f"127.0.0.1:{taken}" in busy.stderr


def test_serve_over_rpc(smol_path: str, workers: list[Worker], tmp_path: Path) -> None:
    with llamaspec.Model(smol_path) as local, llamaspec.Generator(local, n_ctx=512, n_threads=1) as g:
        want = g.generate(PROMPT, 24, temperature=0)
    rpc = ",".join(w.endpoint for w in workers)
    with running(smol_path, "--rpc", rpc, "-t", "1", "-np", "1", "-c", "512", log_dir=tmp_path) as server:
        r = httpx.post(f"{server.url}/v1/completions",
                       json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
