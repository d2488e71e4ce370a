"""The command line (`llamaspec run` and `llamaspec info`), run as a user runs it: a subprocess, on the
fixtures and on SmolLM2, with pipes and in a pseudo-terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path
from xml.etree import ElementTree

import pyte
import pytest
from llamaspec_fixtures import FixtureInfo

import llamaspec

TIMEOUT = 120


def cli(*args: str, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m llamaspec ARGS` with pipes for stdin, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "llamaspec", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )


def cycle_prompt(info: FixtureInfo, n: int = 8) -> str:
    with llamaspec.Model(info.path, vocab_only=True) as vm:
        return vm.detokenize(info.cycle[:n])


def expected_text(info: FixtureInfo, prompt: str, n: int) -> str:
    """Plain greedy decoding of the same prompt in the library: the oracle for run's output (the
    fixture tests pass --raw: the fixture has a chat template, which run would apply)."""
    with llamaspec.Model(info.path) as m, llamaspec.Generator(m, n_ctx=512) as g:
        return g.generate(prompt, n, temperature=0)


# -- run: the output first (lossless, greedy and seeded) -------------------------------------------


def test_run_greedy_output_is_plain_decoding(fx_info: FixtureInfo) -> None:
    prompt = cycle_prompt(fx_info)
    want = expected_text(fx_info, prompt, 40)
    outs = {}
    for name, extra in {"default": [], "fixed": ["--n-draft", "3"], "plain": ["--method", "none"]}.items():
        r = cli("run", fx_info.path, "--raw", "-p", prompt, "-n", "40", "--temp", "0", "-c", "512", "--json",
                *extra)
        assert r.returncode == 0, r.stderr
        outs[name] = json.loads(r.stdout)
    assert {k: v["text"] for k, v in outs.items()} == {k: want for k in outs}
    d = outs["default"]
    assert d["method"] == "mtp" and d["n_draft"] == "auto" and d["interrupted"] is False
    assert d["stats"]["tokens"] == 40 and d["stats"]["finish_reason"] == "length"
    assert set(d["speculative"]) >= {"acceptance_rate", "drafts_generated", "mean_draft_length"}
    assert outs["fixed"]["n_draft"] == 3 and outs["fixed"]["speculative"]["drafts_generated"] > 0
    assert outs["plain"]["method"] == "none" and "speculative" not in outs["plain"]


def test_run_seeded_output_is_plain_decoding(smol_path: str) -> None:
    """SmolLM2 drafting for itself, sampled with a seed, through its chat template: the same text as
    plain decoding with that seed."""
    common = ["-p", "Name three rivers.", "-n", "24", "--temp", "0.9", "-s", "11", "-c", "1024", "--json"]
    plain = cli("run", smol_path, "--method", "none", *common)
    spec = cli("run", smol_path, "-md", smol_path, "--n-draft", "3", *common)
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    p, s = json.loads(plain.stdout), json.loads(spec.stdout)
    assert s["method"] == "draft" and s["speculative"]["drafts_generated"] > 0
    assert p["text"] == s["text"] and p["stats"]["seed"] == s["stats"]["seed"] == 11
    # the chat template was applied: the prompt is longer than the question's own tokens
    with llamaspec.Model(smol_path, vocab_only=True) as vm:
        assert p["stats"]["prompt_tokens"] > len(vm.tokenize("Name three rivers."))



def test_run_with_a_json_schema_equals_the_library(smol_path: str, tmp_path: Path) -> None:
    """-j / -jf: the library's text under the same schema, with a draft model drafting."""
    schema = {"type": "object", "properties": {"river": {"type": "string", "maxLength": 20}},
              "required": ["river"], "additionalProperties": False}
    question = "Name a long river, as JSON."
    with llamaspec.Model(smol_path) as m, llamaspec.Generator(m, n_ctx=1024, n_threads=2) as g:
        want = g.generate(messages=[{"role": "user", "content": question}], max_tokens=40, temperature=0,
                          json_schema=schema)
    common = ["-p", question, "-n", "40", "--temp", "0", "-c", "1024", "-t", "2"]
    r = cli("run", smol_path, "-md", smol_path, *common, "-j", json.dumps(schema))
    assert r.returncode == 0 and r.stdout == want, r.stderr
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    r = cli("run", smol_path, "--method", "none", *common, "-jf", str(f))
    assert r.returncode == 0 and r.stdout == want, r.stderr
    p = ["-p", "x", "-n", "4"]
    one_line_error(cli("run", smol_path, *p, "-j", "{not json"), 1, "not valid JSON")
    one_line_error(cli("run", smol_path, *p, "-j", "{}", "--grammar", 'root ::= "a"'), 1, "one of")
    number_range = '{"type": "number", "maximum": 3}'
    one_line_error(cli("run", smol_path, *p, "-j", number_range), 1, "range on a number")
    one_line_error(cli("run", smol_path, *p, "-jf", str(tmp_path / "none.json")), 1, "none.json")
    one_line_error(cli("serve", smol_path, "-j", '{"type": "hiccup"}'), 2, "hiccup")

def test_run_streams_text_to_a_pipe_without_escape_codes(fx_info: FixtureInfo) -> None:
    prompt = cycle_prompt(fx_info)
    r = cli("run", fx_info.path, "--raw", "-p", prompt, "-n", "20", "--temp", "0", "-c", "512")
    assert r.returncode == 0, r.stderr
    assert r.stdout == expected_text(fx_info, prompt, 20)
    assert "\x1b" not in r.stdout + r.stderr
    assert "20 tokens in" in r.stderr and "tok/s" in r.stderr and "mtp: acceptance" in r.stderr


def test_run_reads_the_prompt_from_a_file_and_from_stdin(fx_info: FixtureInfo, tmp_path: Path) -> None:
    prompt = cycle_prompt(fx_info)
    f = tmp_path / "prompt.txt"
    f.write_text(prompt)
    want = expected_text(fx_info, prompt, 12)
    by_file = cli("run", fx_info.path, "--raw", "-f", str(f), "-n", "12", "--temp", "0", "-c", "512")
    by_stdin = cli("run", fx_info.path, "--raw", "-n", "12", "--temp", "0", "-c", "512", stdin=prompt)
    assert (by_file.returncode, by_stdin.returncode) == (0, 0), by_file.stderr + by_stdin.stderr
    assert by_file.stdout == by_stdin.stdout == want


def read_pty(fd: int, proc: subprocess.Popen[bytes], until: float) -> bytes:
    out = b""
    while time.monotonic() < until:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


def in_pty(args: list[str], stdin_tty: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m llamaspec ARGS` with stdout and stderr (and with ``stdin_tty`` stdin, as the
    controlling terminal, so that Ctrl-C typed there is SIGINT) on a pseudo-terminal (24 x 80)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {**os.environ, "TERM": "xterm", "LINES": "24", "COLUMNS": "80"}
    proc = subprocess.Popen([sys.executable, "-m", "llamaspec", *args],
                            stdin=slave if stdin_tty else subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=env, start_new_session=True,
                            preexec_fn=(lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0)) if stdin_tty else None)
    os.close(slave)
    return proc, master


def screen_of(out: bytes) -> list[str]:
    """What a 24 x 80 VT100 terminal shows after ``out`` (pyte, a terminal emulator)."""
    screen = pyte.Screen(80, 24)
    pyte.ByteStream(screen).feed(out.replace(b"\n", b"\r\n"))  # the tty's onlcr, which openpty keeps
    return list(screen.display)


def test_run_in_a_terminal_draws_a_status_line_and_gives_the_screen_back(fx_info: FixtureInfo) -> None:
    prompt = cycle_prompt(fx_info)
    proc, fd = in_pty(["run", fx_info.path, "--raw", "-p", prompt, "-n", "200", "--temp", "0", "-c", "512"])
    try:
        out = read_pty(fd, proc, time.monotonic() + TIMEOUT)
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        os.close(fd)
    text = out.decode("utf-8", "replace")
    assert "loading tiny-mtp-f16.gguf [" in text and "100%" in text  # the load's progress bar
    assert "\x1b[1;23r" in text  # the text scrolls in rows 1..23
    assert "\x1b[24;1H" in text and "tok/s" in text and "draft length" in text  # the status in row 24
    assert text.index("\x1b[r") > text.rindex("tok/s |")  # the scrolling region is reset at the end
    # while it ran, the status row showed the statistics; at the end the screen holds the answer
    # (wrapped at 80 columns), then the summary, and the status row is empty again
    last = out.rindex(b"tok/s |")
    during = screen_of(out[: out.index(b"\x1b8", last) + 2])  # up to the end of the last status drawn
    assert "tok/s" in during[23] and "draft length" in during[23]
    after = screen_of(out)
    want = expected_text(fx_info, prompt, 200)
    assert "".join(after[:2]) == want[:160]
    assert any("200 tokens in" in row for row in after[2:5])
    assert after[23].strip() == ""


def test_ctrl_c_stops_the_answer_and_exits_130(fx_info: FixtureInfo) -> None:
    prompt = cycle_prompt(fx_info)
    proc, fd = in_pty(["run", fx_info.path, "--raw", "-p", prompt, "-n", "4000", "--temp", "0", "-c", "4096"])
    try:
        first = b""
        deadline = time.monotonic() + TIMEOUT
        while b"tok/s |" not in first and time.monotonic() < deadline:  # the answer and its status are on
            first += read_pty(fd, proc, time.monotonic() + 0.2)
        assert proc.poll() is None, "the answer ended before Ctrl-C"
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        rest = read_pty(fd, proc, time.monotonic() + 30)
        assert proc.wait(timeout=30) == 130
        assert time.monotonic() - t0 < 10
    finally:
        os.close(fd)
    tail = rest.decode("utf-8", "replace")
    assert "interrupted" in tail and "Traceback" not in tail
    assert "\x1b[r" in tail  # the terminal is given back


# -- run: bad input --------------------------------------------------------------------------------


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("llamaspec "), r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_bad_input_gives_one_line_and_the_documented_exit_code(fx_info: FixtureInfo, tmp_path: Path) -> None:
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("this is not a model\n")
    p = ["-p", "hello"]
    one_line_error(cli("run", str(tmp_path / "missing.gguf"), *p), 1, "missing.gguf")
    one_line_error(cli("run", str(not_gguf), *p), 1, "notes.gguf")
    one_line_error(cli("info", str(tmp_path / "missing.gguf")), 1, "missing.gguf")
    one_line_error(cli("run", fx_info.path, "-f", str(tmp_path / "nope.txt")), 1, "nope.txt")
    one_line_error(cli("run", fx_info.path, "-p", "x" * 3000, "-c", "64"), 1, "context")
    one_line_error(cli("run", fx_info.path, *p, "--method", "telepathy"), 2, "telepathy")
    one_line_error(cli("run", fx_info.path, *p, "-n", "0"), 2, "--n-predict")
    one_line_error(cli("run", fx_info.path, *p, "--n-draft", "many"), 2, "many")
    one_line_error(cli("run", fx_info.path, *p, "--temp", "warm"), 2, "warm")
    one_line_error(cli("run", fx_info.path), 2, "prompt is required")
    one_line_error(cli("run", fx_info.path, *p, "-f", "x.txt"), 2, "-p or -f")
    one_line_error(cli("run", *p), 2, "model is required")
    one_line_error(cli("run", fx_info.path, "-p", "   "), 2, "empty")
    one_line_error(cli("frobnicate"), 2, "invalid choice")
    one_line_error(cli("run", fx_info.path, *p, "-t", "0"), 2, "--threads")
    one_line_error(cli("run", fx_info.path, *p, "-c", "-5"), 2, "--ctx-size")
    one_line_error(cli("chat", fx_info.path, "-ub", "0"), 2, "--ubatch-size")
    one_line_error(cli("bench", fx_info.path, "-ngl", "-3"), 2, "--n-gpu-layers")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    one_line_error(cli("run", fx_info.path, "-f", str(latin1)), 1, "utf-8")


def test_run_stops_when_the_context_is_full(fx_info: FixtureInfo) -> None:
    prompt = cycle_prompt(fx_info)
    r = cli("run", fx_info.path, "--raw", "-p", prompt, "-n", "1000", "--temp", "0", "-c", "64", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["stats"]["prompt_tokens"] + d["stats"]["tokens"] == 64
    assert d["stats"]["finish_reason"] == "length"


def test_verbose_shows_the_traceback(tmp_path: Path) -> None:
    r = cli("run", str(tmp_path / "missing.gguf"), "-p", "hi", "--verbose")
    assert r.returncode == 1 and "Traceback" in r.stderr and "ModelLoadError" in r.stderr


# -- info ----------------------------------------------------------------------------------------


def test_info_describes_an_mtp_fixture(fx_info: FixtureInfo) -> None:
    r = cli("info", fx_info.path, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    with llamaspec.Model(fx_info.path) as m:
        assert d["n_layer"] == m.n_layer and d["n_params"] == m.n_params and d["size_bytes"] == m.size
        assert d["n_layer_mtp"] == m.n_layer_nextn == 1 and d["default_drafter"] == "mtp"
        assert d["architecture"] == "qwen35" and d["n_vocab"] == m.n_vocab
    assert "CPU" in d["build"]["backends"]
    regs = llamaspec.backends()
    assert d["build"]["gpus"] == [f"{n} ({desc})" for _, devs in regs for n, desc, kind in devs
                                  if kind in ("gpu", "igpu")]
    assert d["build"]["rpc"] == any(name == "RPC" for name, _ in regs)
    assert any(kind == "cpu" for _, devs in regs for _, _, kind in devs)
    text = cli("info", fx_info.path)
    assert text.returncode == 0 and "\x1b" not in text.stdout
    assert "+ 1 MTP" in text.stdout and "run/serve draft with it by default" in text.stdout


def test_info_shows_a_chat_template_and_special_tokens(smol_path: str) -> None:
    d = json.loads(cli("info", smol_path, "--json").stdout)
    with llamaspec.Model(smol_path, vocab_only=True) as vm:
        assert d["chat_template"] == vm.chat_template
        assert d["special_tokens"]["eos"]["id"] == vm.eos
        assert {t["id"] for t in d["special_tokens"]["end_of_generation"]} >= {vm.eos}
    assert d["n_layer_mtp"] == 0 and d["default_drafter"] is None
    r = cli("info", smol_path, "--template-lines", "2")
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("chat template"))
    assert "more lines" in lines[start + 3]
    assert lines[start + 1].strip() == vm_first_line(smol_path)


def vm_first_line(path: str) -> str:
    with llamaspec.Model(path, vocab_only=True) as vm:
        assert vm.chat_template is not None
        return vm.chat_template.splitlines()[0].strip()


@pytest.mark.parametrize("command", ["run", "chat", "bench", "info", "serve"])
def test_help_is_complete(command: str) -> None:
    r = cli(command, "--help")
    assert r.returncode == 0 and "\x1b" not in r.stdout
    for flag in {"run": ["-p", "-f", "--json", "-n", "--n-draft", "--method", "--temp", "-c", "-t"],
                 "chat": ["--system", "-n", "--n-draft", "--method", "-md", "--temp", "-c", "-t"],
                 "bench": ["-p", "-n", "-r", "--n-draft", "--method", "-md", "--json", "-t"],
                 "info": ["--json", "--template-lines"],
                 "serve": ["--port", "-np", "--n-draft", "--method", "--temp", "-c", "-t"]}[command]:
        assert re.search(rf"\s{re.escape(flag)}[ ,\n]", r.stdout), flag


# -- bench ---------------------------------------------------------------------------------------


def test_bench_compares_plain_and_each_draft_length(fx_info: FixtureInfo, tmp_path: Path) -> None:
    plot = tmp_path / "bench.svg"
    r = cli("bench", fx_info.path, "--raw", "-p", cycle_prompt(fx_info), "-n", "32", "-r", "2",
            "--n-draft", "auto", "3", "--json", "--plot", str(plot))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["methods"] == ["mtp"] and d["runs"] == 2 and d["tokens"] == 32
    rows = {row["config"]: row for row in d["rows"]}
    assert list(rows) == ["plain", "mtp auto", "mtp 3"]
    assert all(row["same_text_as_plain"] for row in rows.values())  # greedy: lossless
    assert rows["plain"]["vs_plain"] == 1.0 and len(rows["plain"]["runs"]) == 2
    assert rows["mtp 3"]["acceptance_rate"] == 1.0 and rows["mtp 3"]["mean_draft_length"] > 2
    for row in rows.values():
        assert row["tokens_per_second"] > 0
        assert row["vs_plain"] == pytest.approx(row["tokens_per_second"] / rows["plain"]["tokens_per_second"])
    # --plot: the same rows as an SVG, a panel of tokens/s and one of acceptance, a point per figure
    svg = ElementTree.parse(plot).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    panels = {g.get("data-panel"): g for g in svg.iterfind("s:g", ns)}
    assert list(panels) == ["tokens_per_second", "acceptance_rate"]
    rates = [t.text for t in panels["tokens_per_second"].iterfind(".//s:circle/s:title", ns)]
    assert sorted(rates) == sorted(f"mtp {n}: {rows[f'mtp {n}']['tokens_per_second']:.1f} tok/s"
                                   for n in ("auto", "3"))
    accepted = [t.text for t in panels["acceptance_rate"].iterfind(".//s:circle/s:title", ns)]
    assert "mtp 3: 100% accepted" in accepted
    plain_line = panels["tokens_per_second"].find("s:line/s:title", ns)
    assert plain_line is not None
    assert plain_line.text == f"plain: {rows['plain']['tokens_per_second']:.1f} tok/s"
    assert [p.get("data-method") for p in svg.iterfind(".//s:polyline", ns)] == ["mtp", "mtp"]
    table = cli("bench", fx_info.path, "--raw", "-p", cycle_prompt(fx_info), "-n", "16", "-r", "1",
                "--n-draft", "2")
    lines = table.stdout.splitlines()
    assert table.returncode == 0 and lines[1].split()[:3] == ["config", "tok/s", "x"]
    assert lines[3].startswith("plain") and lines[4].startswith("mtp 2") and "\x1b" not in table.stdout


def test_bench_compares_several_drafters_on_smollm2(smol_path: str) -> None:
    r = cli("bench", smol_path, "-p", "Repeat: red green blue red green blue red green blue", "-n", "24",
            "-r", "1", "--method", "ngram-mod", "ngram-simple", "--n-draft", "auto", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["methods"] == ["ngram-mod", "ngram-simple"]
    assert [row["config"] for row in d["rows"]] == [
        "plain", "ngram-mod auto", "ngram-mod 4", "ngram-simple auto", "ngram-simple 4"]
    assert all(row["tokens_per_second"] > 0 for row in d["rows"])


def test_bench_bad_input(smol_path: str, fx_info: FixtureInfo) -> None:
    one_line_error(cli("bench", smol_path, "-n", "8"), 1, "no MTP layers")  # no drafter to compare
    one_line_error(cli("bench", fx_info.path, "-r", "0"), 2, "--repetitions")
    one_line_error(cli("bench", fx_info.path, "--n-draft", "x"), 2, "'x'")
    one_line_error(cli("bench", fx_info.path, "--plot", "/no/such/dir/out.svg"), 2, "--plot", "/no/such/dir")


# -- chat ----------------------------------------------------------------------------------------


def test_chat_piped_turns_see_the_earlier_ones_and_equal_plain_decoding(smol_path: str) -> None:
    """Two messages on standard input: each answer is what plain decoding gives for the conversation
    so far (the second turn sees the first), with a draft model drafting, and the second turn reuses
    the first turn's tokens."""
    questions = ["Name a river in France.", "How long is it?"]
    r = cli("chat", smol_path, "-md", smol_path, "--n-draft", "3", "-n", "24", "--temp", "0", "-c", "1024",
            "--system", "You are brief.", stdin="\n".join(questions) + "\n/stats\n")
    assert r.returncode == 0, r.stderr
    history = [{"role": "system", "content": "You are brief."}]
    want = []
    with llamaspec.Model(smol_path) as m, llamaspec.Generator(m, n_ctx=1024) as g:
        for q in questions:
            history.append({"role": "user", "content": q})
            answer = g.generate(messages=history, max_tokens=24, temperature=0)
            history.append({"role": "assistant", "content": answer})
            want.append(answer)
    assert r.stdout == "".join(a + "\n" for a in want)
    stats = dict(line.strip().split(": ", 1) for line in r.stderr.splitlines() if ": " in line)
    assert stats["turns"] == "2" and int(stats["prompt tokens reused"]) > 20
    assert stats["drafter"].startswith("draft") and "acceptance" in stats


def test_chat_without_a_template_is_a_one_line_error(tmp_path: Path) -> None:
    from llamaspec_fixtures import write_qwen35_fixture

    info = write_qwen35_fixture(tmp_path / "no-template.gguf", chat_template=False)
    with llamaspec.Model(info.path, vocab_only=True) as vm:
        assert vm.chat_template is None
    one_line_error(cli("chat", info.path), 1, "no chat template")
    # run sends the text as it is then, without --raw
    prompt = cycle_prompt(info)
    r = cli("run", info.path, "-p", prompt, "-n", "10", "--temp", "0", "-c", "512")
    assert r.returncode == 0 and r.stdout == expected_text(info, prompt, 10)


class Terminal:
    """A command in a pseudo-terminal, read as a person reads it: wait for some text to appear after
    what was already waited for, type keys."""

    def __init__(self, args: list[str]) -> None:
        self.proc, self.fd = in_pty(args, stdin_tty=True)
        self.seen = bytearray()
        self.pos = 0

    def wait_for(self, what: bytes, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while (i := self.seen.find(what, self.pos)) < 0:
            assert time.monotonic() < deadline, (what, bytes(self.seen[self.pos:])[-400:])
            assert self.proc.poll() is None, bytes(self.seen[self.pos:])[-400:]
            self.seen += read_pty(self.fd, self.proc, time.monotonic() + 0.2)
        self.pos = i + len(what)

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        os.close(self.fd)


def test_chat_in_a_terminal_two_turns_ctrl_c_stats_and_exit(smol_path: str) -> None:
    t = Terminal(["chat", smol_path, "--temp", "0", "-c", "2048", "-n", "600"])
    try:
        t.wait_for(b"> ")
        t.type(b"Name a river.\r")
        t.wait_for(b"\r\n> ")  # the answer, then the prompt again
        t.type(b"Count from 1 to 500, one number a line.\r")
        t.wait_for(b"tok/s")  # the answer is streaming, with its status line
        time.sleep(0.5)
        t.type(b"\x03")  # Ctrl-C, as a person types it: the terminal sends SIGINT
        t.wait_for(b"(stopped)")
        t.wait_for(b"> ")
        t.type(b"/stats\r")
        t.wait_for(b"prompt tokens reused")
        t.wait_for(b"> ")
        t.type(b"/exit\r")
        assert t.proc.wait(timeout=30) == 0
    finally:
        t.close()
    screen = bytes(t.seen).decode("utf-8", "replace")
    assert "Traceback" not in screen
    assert "\x1b[r" in screen[screen.index("(stopped)") - 40:]  # the terminal was given back on Ctrl-C
    turns = re.search(r"turns: (\d+)", screen)
    assert turns is not None and turns.group(1) == "2"
    reused = re.search(r"prompt tokens reused: (\d+)", screen)
    assert reused is not None and int(reused.group(1)) > 0  # the second turn reused the first's tokens
