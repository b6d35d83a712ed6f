#!/usr/bin/env bash
# The main job on the embedded default: creates or reuses the environment, then runs demo/detection_demo.py.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=$(realpath -m "${AA_DET_VENV:-$ROOT/.venv}")   # as setup_env.sh resolves it, from the caller's folder
bash "$ROOT/tools/env/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" demo/detection_demo.py "$@"
