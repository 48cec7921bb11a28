#!/usr/bin/env bash
# The test suite, set-up included (README "Quick start"; .ci/run calls this): makes or reuses .venv, installs
# torch for this machine (CPU: constraints/cpu.txt; see scripts/_venv.sh), the package in editable mode with
# its test extra, then runs pytest from the checkout. Arguments go to pytest:
#   scripts/test.sh                 the CPU suite
#   scripts/test.sh -m gpu          the GPU suite (on a GPU machine)
#   scripts/test.sh tests/test_guide.py -x
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/_venv.sh
source "$ROOT/scripts/_venv.sh"
# Editable: the tests (and the subprocesses they start) see this working tree, whatever is edited next.
python -m pip install -q -e ".[test]"
set +e
python -m pytest -q "$@"
rc=$?
set -e
[ "$rc" -eq 5 ] && echo "pytest collected no test" >&2
exit "$rc"
