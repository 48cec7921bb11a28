#!/usr/bin/env bash
# Two device_run.sh step lists at once on a 2-GPU machine (nvidia-h200-x2), one per GPU, each with its own
# TMPDIR (JIT cache, wheels) and OUT subfolder; then one small results tarball.
#   OUT=DIR bash scripts/device_pair.sh "STEPS FOR GPU 0" "STEPS FOR GPU 1"   (STEP_TIMEOUT / PAIR_TIMEOUT: seconds)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_REAL=${OUT:?OUT must be set}
for g in 0 1; do
    steps=$([ $g = 0 ] && echo "$1" || echo "$2")
    [ -z "$steps" ] && continue
    mkdir -p /tmp/pair/g$g/tmp /tmp/pair/out/g$g
    # shellcheck disable=SC2086
    ( CUDA_VISIBLE_DEVICES=$g TMPDIR=/tmp/pair/g$g/tmp OUT=/tmp/pair/out/g$g timeout "${PAIR_TIMEOUT:-560}" \
        bash scripts/device_run.sh $steps > /tmp/pair/out/g$g/run.log 2>&1 ) &
done
wait
cd /tmp/pair/out && tar -czf "$OUT_REAL/results.tgz" --exclude='ckpt*' --exclude='*.so' .
grep -h "^== " /tmp/pair/out/g*/run.log
