#!/usr/bin/env bash
# The main job, set-up included (README "Quick start"): makes or reuses .venv, installs torch for this machine
# (CPU: constraints/cpu.txt; see scripts/_venv.sh) and this package (a regular, non-editable install), then runs
# examples/compile_conformer.py: torch.compile(Conformer, backend="oasr") next to backend="inductor", steady-state
# latency, the error against eager fp32, and the tuning report. Arguments go to the example:
#   scripts/run_main_job.sh                          defaults (GPU: Conformer S, B=2 x 400 frames; CPU: a quick run)
#   scripts/run_main_job.sh --size M --batch 16 --frames 1000
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/_venv.sh
source "$ROOT/scripts/_venv.sh"
python -m pip install -q "$ROOT"
# Run from outside the checkout: the example must use the installed package, not the source tree.
cd "${TMPDIR:-/tmp}"
exec python "$ROOT/examples/compile_conformer.py" "$@"
