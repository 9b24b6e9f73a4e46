#!/usr/bin/env bash
# What the status-page tests (tests/federation/test_status_page.py) need: a headless Chromium, from the
# Debian package `chromium` (/usr/bin/chromium; FEDSBDT_CHROMIUM names another binary).
#
# Unlike container-setup.sh this FAILS when it cannot install Chromium: the page is tested in a real
# browser and those tests fail (never skip) without one, so CI stops here with the reason instead.
set -euo pipefail
chromium="${FEDSBDT_CHROMIUM:-/usr/bin/chromium}"
say() { echo ".ci/browser-setup: $*" >&2; }

if [ -x "$chromium" ]; then
  say "ready: $("$chromium" --version 2>/dev/null || echo "$chromium")"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo -n"
say "installing chromium (missing: $chromium)"
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null; }; then
  say "FAILED: cannot install the Debian package chromium (apt-get update; apt-get install -y chromium);"
  say "the status-page tests need it (or set FEDSBDT_CHROMIUM to a Chromium binary)"
  exit 1
fi
if [ ! -x "$chromium" ]; then
  say "FAILED: chromium was installed but $chromium does not exist"
  exit 1
fi
say "ready: $("$chromium" --version 2>/dev/null || echo "$chromium")"
