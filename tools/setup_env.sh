#!/usr/bin/env bash
# Create or reuse the project's virtual environment with the pinned stack.
#
#   bash tools/setup_env.sh          # idempotent: a second run takes about a second
#
# Environment variables (all optional):
#   AA_DET_VENV         where the venv lives              (default: <repo>/.venv)
#   AA_DET_PYTHON       interpreter that creates it       (default: python3.11)
#   AA_DET_CONSTRAINTS  pins to install against           (default: requirements/constraints.txt)
#   AA_DET_CACHE        where built mmcv wheels are kept  (default: ~/.cache/aa_det)
#
# mmcv 2.1.0 exists on PyPI only as source. It is built once per (mmcv, torch, python, cpu|cuda)
# key with MMCV_WITH_OPS=1, --no-build-isolation, setuptools<82 and -std=c++20 (torch 2.14's
# headers need C++20; mmcv's setup.py asks for c++14/17), then cached as a wheel.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${AA_DET_VENV:-$ROOT/.venv}
PYTHON=${AA_DET_PYTHON:-python3.11}
CONSTRAINTS=${AA_DET_CONSTRAINTS:-$ROOT/requirements/constraints.txt}
CACHE=${AA_DET_CACHE:-$HOME/.cache/aa_det}
say() { echo "[aa_det setup] $*" >&2; }

[ -f "$CONSTRAINTS" ] || { say "constraints file not found: $CONSTRAINTS (AA_DET_CONSTRAINTS)"; exit 2; }
KEY=$(cat "$CONSTRAINTS" "$ROOT/setup.py" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
STAMP="$VENV/.aa_det_env"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null || { say "no '$PYTHON' on PATH; set AA_DET_PYTHON"; exit 2; }
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
PIN=(-c "$CONSTRAINTS")

say "installing torch, torchvision and build tools"
"${PIP[@]}" install "${PIN[@]}" 'setuptools<82' wheel ninja torch torchvision

MMCV_VER=$(sed -n 's/^mmcv==\([^ ;#]*\).*/\1/p' "$CONSTRAINTS")
[ -n "$MMCV_VER" ] || { say "no 'mmcv==X' pin in $CONSTRAINTS"; exit 2; }
read -r TORCH_VER PY_TAG HAS_CUDA < <("$VENV/bin/python" -c \
  'import sys, torch; print(torch.__version__, f"cp{sys.version_info[0]}{sys.version_info[1]}", int(torch.cuda.is_available()))')
FLAVOR=cpu
if [ "$HAS_CUDA" = 1 ] && command -v nvcc >/dev/null; then FLAVOR=cuda; fi
WHEELS="$CACHE/wheels/mmcv-$MMCV_VER-torch$TORCH_VER-$PY_TAG-$FLAVOR"
if ! ls "$WHEELS"/mmcv-*.whl >/dev/null 2>&1; then
  say "building mmcv $MMCV_VER with ops for torch $TORCH_VER ($FLAVOR); ~8 min on 2 cores (CPU), longer with CUDA"
  SRC=$(mktemp -d)
  trap 'rm -rf "$SRC"' EXIT
  "${PIP[@]}" download --no-deps --no-binary :all: -d "$SRC" "mmcv==$MMCV_VER"
  tar xzf "$SRC"/mmcv-"$MMCV_VER".tar.gz -C "$SRC"
  sed -i 's/-std=c++1[47]/-std=c++20/g' "$SRC/mmcv-$MMCV_VER/setup.py"
  mkdir -p "$WHEELS.partial"
  EXTRA=()
  [ "$FLAVOR" = cuda ] && EXTRA=(FORCE_CUDA=1)
  # -g0: no debug info (Python's own CFLAGS carry -g), a faster build and a smaller wheel
  (cd "$SRC/mmcv-$MMCV_VER" && env MMCV_WITH_OPS=1 MAX_JOBS="$(nproc)" CFLAGS="-g0" "${EXTRA[@]}" \
     "$VENV/bin/python" -m pip --disable-pip-version-check -q wheel --no-build-isolation --no-deps \
     -w "$WHEELS.partial" .)
  rm -rf "$WHEELS" && mv "$WHEELS.partial" "$WHEELS"
fi

say "installing mmcv (cached wheel), mmengine, mmdet, pycocotools and aa_det"
"${PIP[@]}" install "${PIN[@]}" "$WHEELS"/mmcv-*.whl
"${PIP[@]}" install "${PIN[@]}" --no-build-isolation -e "$ROOT[tests]"
"$VENV/bin/python" -c 'import mmcv.ops, mmdet, aa_det' || { say "import check failed"; exit 1; }
echo "$KEY" > "$STAMP"
say "environment ready: $VENV"
