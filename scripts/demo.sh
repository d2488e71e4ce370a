#!/usr/bin/env bash
# The README's main-job command: install llamaspec into a virtual environment and run the MTP demo
# (writes the speed fixture if missing, plain vs MTP side by side with live tokens/s and acceptance,
# then a table). Extra arguments go to examples/mtp_demo.py, e.g. --model X.gguf --chat "question".
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${LLAMASPEC_VENV:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$(cd "$venv" && pwd)/bin/python"
"$py" -m pip install --quiet ".[demo]"
"$py" -m pip install --quiet ./fixtures  # the fixture writers (llamaspec_fixtures, not in the wheel)
"$py" examples/mtp_demo.py "$@"
