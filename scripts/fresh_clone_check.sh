#!/usr/bin/env bash
# Does the README's Quick start work on a fresh machine? Clones the committed HEAD of this checkout into a
# temporary directory and runs the two commands of the README's Quick start block there, exactly as written
# (no venv, no PYTHONPATH, no OASR_* variables inherited; empty caches: ~/.cache's pip, oasr JIT and tuning
# tiers, and Inductor's, as on a new machine), then prints a summary: each command's exit code, time
# and last lines, where the main job's oasr_ops came from, and the size of the venv the commands made.
#
#   scripts/fresh_clone_check.sh            (KEEP=1 keeps the temporary clone)
# Too slow for every CI run (a venv, torch, the main job and the whole suite): run it before a release.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHA=$(git -C "$ROOT" rev-parse HEAD)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oasr-fresh.XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ] \
    && echo "note: uncommitted changes in $ROOT are NOT part of this check (it clones $SHA)"

git clone -q "$ROOT" "$WORK/repo" && git -C "$WORK/repo" checkout -q --detach "$SHA" || { echo "clone failed"; exit 1; }
cd "$WORK/repo"
# The Quick start block: the first ```bash block after "## Quick start", one command a line, comments dropped.
mapfile -t CMDS < <(awk '/^## Quick start/{q=1} q && /^```bash/{b=1; next} b && /^```/{exit} b' README.md \
                    | sed -e 's/[[:space:]]#.*$//' -e 's/[[:space:]]*$//' | grep -v '^[[:space:]]*$')
if [ "${#CMDS[@]}" -ne 2 ]; then
    echo "README's Quick start has ${#CMDS[@]} commands, expected 2: ${CMDS[*]}"; exit 1
fi

# A fresh shell: no active venv, nothing of the caller's on the import path.
CLEAN_PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -e '/\.venv/' -e "${VIRTUAL_ENV:-/nonexistent}" | paste -sd: -)
run_clean() {
    env -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME $(env | sed -n 's/^\(OASR_[A-Z_]*\|TORCHINDUCTOR_[A-Z_]*\)=.*/-u \1/p') \
        PATH="$CLEAN_PATH" XDG_CACHE_HOME="$WORK/cache" TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" bash -c "$1"
}

declare -a RC SECS
for i in 0 1; do
    echo "=== [$((i + 1))/2] \$ ${CMDS[$i]}   (in $WORK/repo)"
    start=$(date +%s)
    run_clean "${CMDS[$i]}" 2>&1 | tee "$WORK/cmd$i.log"
    RC[$i]=${PIPESTATUS[0]}
    SECS[$i]=$(( $(date +%s) - start ))
done

echo
echo "================ fresh clone check: summary ================"
echo "commit     $SHA ($(git log -1 --format=%s | cut -c1-70))"
echo "clone      $WORK/repo"
echo "python     $(run_clean 'python3 --version' 2>&1), $(nproc) CPU cores, GPU: $(nvidia-smi -L 2>/dev/null | head -1 || echo none)"
for i in 0 1; do
    status=$([ "${RC[$i]}" -eq 0 ] && echo ok || echo "FAILED (exit ${RC[$i]})")
    echo "command $((i + 1))  \$ ${CMDS[$i]}  ->  $status in ${SECS[$i]} s"
    grep -v '^[[:space:]]*$' "$WORK/cmd$i.log" | tail -n 4 | sed 's/^/             | /'
done
from=$(grep -m1 '^oasr_ops .* from ' "$WORK/cmd0.log" | sed 's/.* from \([^;]*\);.*/\1/')
case "$from" in
    "$WORK/repo/.venv/"*) echo "main job   used the installed package: $from" ;;
    *) echo "main job   did NOT use the venv's installed package (oasr_ops from: ${from:-?})"
       [ "${RC[0]}" -eq 0 ] && RC[0]=1 ;;
esac
if [ -d .venv ]; then
    cuda_libs=$(.venv/bin/python -m pip list 2>/dev/null | awk '{print $1}' | grep -i '^nvidia-' | grep -vi '^nvidia-cutlass$' | paste -sd' ' -)
    echo "venv       $(du -sh .venv | cut -f1), torch $(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null); CUDA wheels: ${cuda_libs:-none}"
fi
if [ "${RC[0]}" -eq 0 ] && [ "${RC[1]}" -eq 0 ]; then echo "RESULT     PASS"; exit 0; fi
echo "RESULT     FAIL"; exit 1
