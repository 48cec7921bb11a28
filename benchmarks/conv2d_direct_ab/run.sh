#!/usr/bin/env bash
# bash run.sh DIR OUT_FILE : run the prebuilt A/B on the GPU host (no compilation)
set -euo pipefail
cd "$1"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$2"
./bench ./old_*.so ./new_*.so ./x_*.so >> "$2" 2>&1
