#!/usr/bin/env bash
# The browser for the chat page's tests (tests/test_webui.py): Debian's chromium and chromium-driver,
# a matched pair from one registry (selenium drives them; nothing downloads a browser or a driver).
# Does nothing when both are on PATH; installs them with apt-get as root (or with password-less sudo).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "install_browser.sh: chromium and chromium-driver are missing and apt-get needs root:" >&2
  echo "  sudo apt-get install chromium chromium-driver" >&2
  exit 1
fi
echo "installing Debian packages: chromium chromium-driver"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
