#!/usr/bin/env bash
# Debian packages, installed only when missing (needs root, as on CI and dev machines).
#   system-deps.sh          what the tests use: Prometheus + promtool (rules, end-to-end
#                           scrape), Alertmanager (alerts routed to a webhook), Chromium
#                           (+ a colour emoji font for its screenshots) for the console's
#                           browser test, nginx (the hot/cold paths routed by tier),
#                           and tcmalloc;
#   system-deps.sh --serve  what `serve` benefits from: libtcmalloc-minimal4, the
#                           allocator it preloads for the engine (serving/engine/allocator.py).
#                           Optional: without root it says in one line what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
SERVE_PACKAGES=(libtcmalloc-minimal4)
TEST_PACKAGES=(prometheus prometheus-alertmanager chromium fonts-noto-color-emoji nginx "${SERVE_PACKAGES[@]}")
mode=${1:-test}
[ "$mode" = --serve ] && wanted=("${SERVE_PACKAGES[@]}") || wanted=("${TEST_PACKAGES[@]}")

missing=()
for p in "${wanted[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

say_tcmalloc_missing() {
  echo "  tcmalloc missing (apt-get install libtcmalloc-minimal4, as root): serve runs on" \
       "glibc malloc: the engine grows ~1.7x more per new batch shape and keeps growing on" \
       "shapes it has seen (docs/benchmarks.md, engine allocator)" >&2
}
install_missing() {
  export DEBIAN_FRONTEND=noninteractive
  step "apt package lists" apt-get update -qq
  step "Debian: ${missing[*]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [ "$mode" != --serve ]; then
  install_missing  # the tests need them: a failure stops `make test`
elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  say_tcmalloc_missing
else  # optional for serve: a failed install (offline, no mirror) is said, not fatal
  ( install_missing ) || say_tcmalloc_missing
fi
