#!/usr/bin/env bash
# Debian packages the tests use: Prometheus + promtool (rules, end-to-end scrape);
# Chromium (+ a colour emoji font for its screenshots) for the console's browser test.
# libtcmalloc-minimal4: the allocator `serve` preloads for the engine (serving/engine/allocator.py).
# Idempotent: installs only what is missing. Needs root (as on CI and dev machines).
set -euo pipefail
PACKAGES=(prometheus chromium fonts-noto-color-emoji libtcmalloc-minimal4)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
