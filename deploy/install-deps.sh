#!/bin/sh
# Installs the Debian packages omnivore needs to build, test and run, when any is missing.
# (libsystemd-dev: sd_notify for omnivored.service; the build works without it: -Dsystemd=auto.)
# Usage: deploy/install-deps.sh        (as root, or with sudo available)
set -eu

PACKAGES="build-essential meson ninja-build pkg-config protobuf-c-compiler libprotobuf-c-dev \
libzmq3-dev libopenblas-dev check zlib1g-dev libinih-dev libsystemd-dev dataset-fashion-mnist"

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

echo "install-deps: installing:$missing" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "install-deps: need root (or sudo) to install:$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
