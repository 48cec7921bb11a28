#!/usr/bin/env bash
# bash run.sh DIR OUT_FILE : run the prebuilt benchmark on the GPU host (no compilation)
set -euo pipefail
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; "$1/bench"; } > "$2" 2>&1
