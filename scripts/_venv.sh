# Sourced by scripts/run_main_job.sh and scripts/test.sh (not run on its own): make or reuse the project's venv,
# activate it, and install torch the right way for this machine BEFORE the package, so that pip never pulls
# PyPI's multi-GB CUDA build of torch onto a CPU machine on its own.
#
#   OASR_VENV=DIR            the venv (default: .venv in the checkout)
#   PYTHON=python3.11        the interpreter that creates it (default: python3; needs >= 3.10)
#   OASR_TORCH=cpu|cuda      which torch build to install (default: cuda when `nvidia-smi -L` lists a GPU, else cpu)
#   OASR_TORCH_INDEX_URL=URL the index to take torch from (e.g. PyTorch's CPU wheel index on a CPU machine whose
#                            pip would otherwise resolve the CUDA build; unset: pip's configured index)
# A torch that already imports in the venv is kept as it is.
set -euo pipefail
: "${ROOT:?set ROOT to the checkout before sourcing scripts/_venv.sh}"
OASR_VENV=${OASR_VENV:-$ROOT/.venv}
if [ ! -x "$OASR_VENV/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$OASR_VENV"
fi
# shellcheck disable=SC1091
. "$OASR_VENV/bin/activate"
python -c 'import sys; assert sys.version_info >= (3, 10), "oasr_ops needs Python >= 3.10, this venv has " + sys.version'
python -m pip install -q --upgrade pip

_oasr_install_torch() {
    local kind=${OASR_TORCH:-}
    if [ -z "$kind" ]; then
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then kind=cuda; else kind=cpu; fi
    fi
    local index=()
    [ -n "${OASR_TORCH_INDEX_URL:-}" ] && index=(--index-url "$OASR_TORCH_INDEX_URL")
    case "$kind" in
    cuda)
        echo "[setup] GPU machine: installing the CUDA build of torch>=2.11 (several GB)"
        python -m pip install -q "${index[@]}" "torch>=2.11" ;;
    cpu)
        echo "[setup] CPU machine: installing torch from constraints/cpu.txt (the CPU build)"
        # Resolve first, install only if no CUDA library comes with it: on Linux, PyPI's default torch wheel
        # is the CUDA build and drags ~3 GB of nvidia-* wheels along.
        local report
        report=$(mktemp)
        python -m pip install -q --dry-run --ignore-installed --report "$report" "${index[@]}" \
            -c "$ROOT/constraints/cpu.txt" torch
        local cuda_libs
        cuda_libs=$(python - "$report" <<'PY'
import json, sys
items = json.load(open(sys.argv[1]))["install"]
print(" ".join(sorted(i["metadata"]["name"] for i in items if i["metadata"]["name"].lower().startswith("nvidia-"))))
PY
)
        rm -f "$report"
        if [ -n "$cuda_libs" ]; then
            echo "[setup] refusing: this pip resolves torch to a CUDA build (it would install: $cuda_libs)." >&2
            echo "[setup] On a CPU machine set OASR_TORCH_INDEX_URL to PyTorch's CPU wheel index" >&2
            echo "[setup] (https://download.pytorch.org/whl/cpu), or OASR_TORCH=cuda to install the CUDA build anyway." >&2
            return 2
        fi
        python -m pip install -q "${index[@]}" -c "$ROOT/constraints/cpu.txt" torch ;;
    *)
        echo "[setup] OASR_TORCH must be cpu or cuda, got '$kind'" >&2; return 2 ;;
    esac
}

if ! python -c 'import torch' >/dev/null 2>&1; then
    _oasr_install_torch
fi
python -c 'import sys, torch; print("[setup] venv", sys.prefix + ": torch", torch.__version__ + ", CUDA available:", torch.cuda.is_available())'
