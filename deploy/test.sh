#!/bin/sh
# The whole test suite (unit and integration): installs what is missing, builds, runs it.
# Extra arguments go to `meson test` (for example --suite unit, or --setup=valgrind).
set -eu
cd "$(dirname "$0")/.."
./deploy/build.sh
exec meson test -C build --print-errorlogs "$@"
