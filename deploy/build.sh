#!/bin/sh
# Configures (once) and builds omnivore in ./build.
set -eu
cd "$(dirname "$0")/.."
"$PWD/deploy/install-deps.sh"
[ -f build/build.ninja ] || meson setup build --buildtype=debugoptimized >/dev/null
ninja -C build >/dev/null
