"""llama.cpp's own server test suite (tools/server/tests of the pinned tree) against `llamaspec serve`,
through scripts/upstream_server_tests.py: every test llama-server itself passes in the same setup must
pass here, except the few that wait for a later issue (listed in the script)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parent.parent


def test_upstream_server_suite(capsys: pytest.CaptureFixture[str]) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "upstream_server_tests.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    summary = (
        r.stdout[r.stdout.rfind("upstream tests passed") - 12 :]
        if "upstream tests passed" in r.stdout
        else ""
    )
    with capsys.disabled():
        print("\n" + (summary or r.stdout[-3000:] + r.stderr[-3000:]))
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
