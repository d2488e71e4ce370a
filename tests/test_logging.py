"""llama.cpp's log goes to logging.getLogger("llamaspec.llama_cpp"); nothing is written raw."""

from __future__ import annotations

import logging

import pytest

import llamaspec

pytestmark = pytest.mark.fixture


def test_llama_log_goes_to_python_logging(fx_info, caplog: pytest.LogCaptureFixture,
                                          capfd: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.DEBUG, logger="llamaspec.llama_cpp"):
        with llamaspec.Model(fx_info.path) as m, llamaspec.Generator(m, n_ctx=128, n_threads=1) as g:
            g.generate("hi", 4, temperature=0)
    records = [r for r in caplog.records if r.name == "llamaspec.llama_cpp"]
    assert len(records) > 10
    assert any("qwen35" in r.getMessage() for r in records)
    assert all("\n" not in r.getMessage() for r in records)  # one record per line
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_errors_are_logged_not_printed(fx: llamaspec.Model, caplog: pytest.LogCaptureFixture,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.WARNING, logger="llamaspec.llama_cpp"):
        with llamaspec.Generator(fx, n_ctx=128, n_threads=1) as g, pytest.raises(llamaspec.GrammarError):
            g.generate("hi", 4, grammar="root ::= undefined-rule")
    assert any(r.levelno == logging.ERROR and "undefined-rule" in r.getMessage() for r in caplog.records)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the grammar parser's fprintf is patched (patches/0001)


def test_quiet_by_default(fx_info, capfd: pytest.CaptureFixture[str]) -> None:
    with llamaspec.Model(fx_info.path) as m, llamaspec.Generator(m, n_ctx=128, n_threads=1) as g:
        g.generate("hi", 4, temperature=0)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
