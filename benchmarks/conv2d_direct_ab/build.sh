#!/usr/bin/env bash
# bash build.sh DIR : compile DIR/*.cu (rendered by render.py) into .so files and the harness into DIR/bench
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$1"
for f in *.cu; do nvcc -O3 -std=c++17 -arch=sm_90a -Xcompiler -fPIC -shared -o "${f%.cu}.so" "$f" & done
nvcc -O3 -std=c++17 -arch=sm_90a -o bench "$here/harness.cu" -ldl &
wait
