#!/usr/bin/env bash
# bash build.sh DIR : compile bench.cu with DIR/variants.inc (gen.py) into DIR/bench
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nvcc -O3 -std=c++17 -arch=sm_90a -I "$1" -o "$1/bench" "$here/bench.cu"
