#!/usr/bin/env bash
# Two device_run.sh step lists at once on a 2-GPU machine (nvidia-h200-x2), one per GPU, each in its own copy of
# the checkout (a step that rebuilds a shipped DB under db/ must not change what the other GPU's steps load), with
# its own TMPDIR (JIT cache, wheels) and OUT subfolder; then one small results tarball. A copied db/ that a step
# rewrote comes back as OUT/g<N>/db/ (compare with the checkout's before committing it).
#   OUT=DIR bash scripts/device_pair.sh "STEPS FOR GPU 0" "STEPS FOR GPU 1"   (STEP_TIMEOUT / PAIR_TIMEOUT: seconds)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_REAL=${OUT:?OUT must be set}
SRC=$PWD
for g in 0 1; do
    steps=$([ $g = 0 ] && echo "$1" || echo "$2")
    [ -z "$steps" ] && continue
    rm -rf /tmp/pair/out/g$g && mkdir -p /tmp/pair/g$g/tmp /tmp/pair/out/g$g  # results of this call only
    rm -rf /tmp/pair/g$g/repo && cp -r "$SRC" /tmp/pair/g$g/repo
    # shellcheck disable=SC2086
    ( cd /tmp/pair/g$g/repo && CUDA_VISIBLE_DEVICES=$g TMPDIR=/tmp/pair/g$g/tmp OUT=/tmp/pair/out/g$g \
        timeout "${PAIR_TIMEOUT:-560}" bash scripts/device_run.sh $steps > /tmp/pair/out/g$g/run.log 2>&1
      diff -rq "$SRC/db" /tmp/pair/g$g/repo/db > /dev/null || cp -r /tmp/pair/g$g/repo/db /tmp/pair/out/g$g/db
    ) &
done
wait
cd /tmp/pair/out && tar -czf "$OUT_REAL/results.tgz" --exclude='ckpt*' --exclude='*.so' .
grep -h "^== " /tmp/pair/out/g*/run.log
