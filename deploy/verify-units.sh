#!/bin/sh
# Checks the systemd units as they are installed: `meson install --destdir` into a temporary root
# (so ExecStart's binaries exist at the paths the units name), the host's unit folder added for
# the targets they refer to, then `systemd-analyze verify --root`. Also keeps worker.conf and the
# worker unit in step (every ${KEY} the unit uses is documented, every documented key is used).
# Usage: verify-units.sh BUILD_DIR UNIT_DIR SYSCONF_DIR MESON        (a meson test; 77 = skipped)
set -eu
build=$1 unitdir=$2 sysconfdir=$3 meson=$4
src=$(cd "$(dirname "$0")" && pwd)

# The unit and the config it reads must agree whatever else is installed.
# shellcheck disable=SC2016
# Keys on ExecStart's line as ${KEY}, and those the worker reads from its environment itself,
# listed on a "worker-env:" comment.
keys_unit=$({
    grep -o '\${OMNIVORE_[A-Z_]*}' "$src/omnivore-worker@.service.in" | tr -d '${}'
    sed -n 's/^#.*worker-env: *//p' "$src/omnivore-worker@.service.in" | tr ' ' '\n'
} | grep . | sort -u)
keys_conf=$(grep -o '^#\?OMNIVORE_[A-Z_]*=' "$src/worker.conf" | tr -d '#=' | sort -u)
if [ "$keys_unit" != "$keys_conf" ]; then
    echo "worker.conf and omnivore-worker@.service.in disagree:" >&2
    echo "unit: $keys_unit" >&2
    echo "conf: $keys_conf" >&2
    exit 1
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "skipped: systemd-analyze is not installed (Debian package systemd)"
    exit 77
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT INT TERM
"$meson" install -C "$build" --destdir "$root" --no-rebuild --quiet >"$root/install.log" 2>&1 || {
    cat "$root/install.log" >&2
    exit 1
}
units="$root$unitdir/omnivored.service $root$unitdir/omnivore-worker@.service"
for u in $units; do
    [ -f "$u" ] || { echo "not installed: $u" >&2; exit 1; }
done
[ -f "$root$sysconfdir/omnivore/worker.conf" ] || { echo "worker.conf not installed" >&2; exit 1; }
# The targets and services the units name (network-online.target, multi-user.target, ...).
mkdir -p "$root/lib/systemd/system"
cp -an /lib/systemd/system/. "$root/lib/systemd/system/"
cp "$root$unitdir/omnivore-worker@.service" "$root$unitdir/omnivore-worker@1.service"
out=$(systemd-analyze verify --man=no --root="$root" "$root$unitdir/omnivored.service" \
    "$root$unitdir/omnivore-worker@1.service" 2>&1) || rc=$?
# Units of the host that are broken in a container are not ours to judge.
mine=$(printf '%s\n' "$out" | grep -E 'omnivore' || true)
echo "systemd-analyze verify: ${mine:-no complaints about the omnivore units}"
if [ -n "$mine" ] || [ "${rc:-0}" -ne 0 ]; then
    printf '%s\n' "$out" >&2
    exit 1
fi
# The exposure score, for people reading the test log.
systemd-analyze security --offline=yes --root="$root" "$root$unitdir/omnivored.service" \
    "$root$unitdir/omnivore-worker@1.service" 2>/dev/null | grep -E 'Overall|→' || true
