#!/usr/bin/env bash
# run.sh — install what is missing, build, and train the default CNN on
# Fashion-MNIST (Debian's dataset-fashion-mnist). Extra arguments go to
# `frugal train`, e.g. scripts/run.sh --epochs 1 --optimizer sgd --lr 0.05
# It builds the CLI and both libraries: all that `cmake --install build`
# installs (tests/test_install.sh checks that this list covers it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target frugal_cli frugal frugal_shared
threads=$(nproc)
exec ./build/frugal train --model cnn --data /usr/share/datasets/fashion-mnist \
    --epochs 3 --batch 128 --optimizer adam --threads "$threads" --save cnn.safetensors "$@"
