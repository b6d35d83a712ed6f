#!/usr/bin/env bash
# Run the test suite: creates or reuses the environment, then pytest (fast selection).
#   bash tools/test.sh               # default: everything not marked slow
#   bash tools/test.sh -m slow       # the slow tests (training runs, distributed)
#   bash tools/test.sh -m ''         # all tests
# Tests run in AA_DET_TEST_WORKERS pytest-xdist workers (default 2; 0: in this process, e.g. for -s or pdb).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${AA_DET_VENV:-$ROOT/.venv}")   # as setup_env.sh resolves it, from the caller's folder
bash "$ROOT/tools/env/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -n "${AA_DET_TEST_WORKERS:-2}" "$@"
