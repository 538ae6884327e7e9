#!/bin/sh
# The whole test suite (unit and integration): installs what is missing, builds, runs it.
# Extra arguments go to `meson test` (for example --suite unit, or --setup=valgrind).
set -eu
cd "$(dirname "$0")/.."
./deploy/build.sh
rc=0
meson test -C build --print-errorlogs "$@" || rc=$?
# One closing line that counts every suite, for people and for CI.
log=build/meson-logs/testlog.json
if [ -f "$log" ]; then
    passed=$(grep -c '"result": "OK"' "$log" || true)
    failed=$(grep -c '"result": "\(FAIL\|TIMEOUT\|ERROR\|UNEXPECTEDPASS\)"' "$log" || true)
    echo "suites: $passed passed, $failed failed"
fi
exit $rc
