#!/bin/sh
# Builds bench_net and compares it with PyTorch case by case (bench/torch_side_by_side.py).
# Needs Debian's python3-torch; installs nothing. Extra arguments go to the Python script
# (for example --batches 64 --threads 1 --reps 5). The last line is one JSON object.
set -eu
cd "$(dirname "$0")/.."
[ -d build ] || meson setup build >/dev/null
ninja -C build bench/bench_net >/dev/null
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "side_by_side: PyTorch is missing for /usr/bin/python3: apt-get install python3-torch" >&2
    echo '{"error": "PyTorch is not installed (python3-torch)"}'
    exit 2
fi
exec /usr/bin/python3 bench/torch_side_by_side.py --bench build/bench/bench_net "$@"
