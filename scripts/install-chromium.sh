#!/usr/bin/env bash
# Chromium, for the chat page's browser test (tests/webui.rs): Debian's package, installed with
# apt when it is missing (as root, or through sudo). A second run does nothing. Prints the path.
#
# $MINFER_CHROMIUM, when set, names a browser to use instead; nothing is installed then.
set -euo pipefail

if [[ -n "${MINFER_CHROMIUM:-}" ]]; then
  command -v "$MINFER_CHROMIUM"
  exit 0
fi
if command -v chromium >/dev/null 2>&1; then
  command -v chromium
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-chromium: no chromium on the PATH and no apt-get to install it; install Chromium" \
       "and put it on the PATH, or set MINFER_CHROMIUM" >&2
  exit 1
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-chromium: apt needs root (or sudo)" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-chromium: installing Debian's chromium package" >&2
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >&2
command -v chromium
