#!/bin/sh
# The main job on one machine: installs what is missing, builds, and trains the Fashion-MNIST
# MLP with an omnivored, two omnivore-worker trainers and an evaluator.
# Extra arguments go to `omnivorectl run` (for example --json, --workers 4, --set train.momentum=0.5).
set -eu
cd "$(dirname "$0")/.."
./deploy/build.sh
exec ./build/server/omnivorectl run examples/fashion-mlp.ini --workers 2 "$@"
