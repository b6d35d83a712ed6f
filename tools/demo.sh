#!/usr/bin/env bash
# The main job on the embedded default: creates or reuses the environment, then runs demo/detection_demo.py.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/tools/env/setup_env.sh"
cd "$ROOT"
exec "${AA_DET_VENV:-$ROOT/.venv}/bin/python" demo/detection_demo.py "$@"
