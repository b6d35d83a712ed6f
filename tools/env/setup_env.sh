#!/usr/bin/env bash
# Create or reuse the project's virtual environment with the pinned stack.
#
#   bash tools/env/setup_env.sh          # idempotent: a second run returns at once (a few seconds
#                                    # where NVIDIA GPUs are present: torch is asked for them)
#
# Environment variables (all optional):
#   AA_DET_VENV             where the venv lives              (default: <repo>/.venv)
#   AA_DET_PYTHON           interpreter that creates it       (default: python3.11)
#   AA_DET_CONSTRAINTS      pins to install against           (default: requirements/constraints.txt)
#   AA_DET_CACHE            where built mmcv wheels are kept  (default: ~/.cache/aa_det)
#   AA_DET_FLAVOR           auto | cpu | cuda: which mmcv ops to build. auto (default): cuda when
#                           torch sees a GPU and nvcc is found (or a CUDA build for these GPUs is
#                           already cached or installed), else cpu. cpu: CPU ops only, even on a GPU
#                           machine. cuda: CUDA ops, also without a GPU (then set TORCH_CUDA_ARCH_LIST).
#   AA_DET_TORCH_INDEX_URL  an extra package index for the torch/torchvision install, for another
#                           CUDA variant of torch, e.g. https://download.pytorch.org/whl/cu126
#                           (a venv that already has torch keeps it: start from a new venv)
#   TORCH_CUDA_ARCH_LIST    GPU architectures of a cuda build, e.g. "8.0;9.0"
#                           (default: those of the GPUs torch sees)
#   CUDA_HOME, CXX          the CUDA toolkit ($CUDA_HOME/bin/nvcc, else nvcc on PATH) and the C++
#                           compiler (default c++) of the mmcv build, as torch's builder uses them
#
# mmcv 2.1.0 exists on PyPI only as source. It is built once per (mmcv, torch, python, flavour and,
# for cuda, GPU architectures) key with MMCV_WITH_OPS=1, --no-build-isolation, setuptools<82 and the
# C++ standard torch's own extension builder uses (C++20 for torch 2.14, whose headers need it; C++17,
# mmcv's own choice, for torch 2.1), then cached as a wheel in
# $AA_DET_CACHE/wheels/mmcv-<ver>-torch<ver>-<py>-cpu or ...-cuda-arch<list>.
#
# The floor stack (torch 2.1, what `mim install` gives mmdet 3.3 users) in a venv of its own:
#   AA_DET_CONSTRAINTS=requirements/constraints-torch2.1.txt AA_DET_VENV=.venv-torch2.1 bash tools/env/setup_env.sh
# The venv's stamp records the same key, so a change of flavour or GPU re-installs the right wheel.
# It records the constraints file too: pins of another torch than the venv was set up with are refused in
# one line, so no venv loses its stack to a forgotten AA_DET_CONSTRAINTS.
# Anything missing that the run needs (venv module, Python.h, a C++17/20 compiler, a matching nvcc)
# is reported in one line, exit status 2, before anything is downloaded where that can be known.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=$(realpath -m "${AA_DET_VENV:-$ROOT/.venv}")   # absolute: the mmcv build runs in another folder
PYTHON=${AA_DET_PYTHON:-python3.11}
CONSTRAINTS=$(realpath -m "${AA_DET_CONSTRAINTS:-$ROOT/requirements/constraints.txt}")
CACHE=${AA_DET_CACHE:-$HOME/.cache/aa_det}
FLAVOR_WANTED=${AA_DET_FLAVOR:-auto}
TORCH_INDEX=${AA_DET_TORCH_INDEX_URL:-}
say() { echo "[aa_det setup] $*" >&2; }
die() { say "$*"; exit 2; }

case "$FLAVOR_WANTED" in auto | cpu | cuda) ;; *) die "AA_DET_FLAVOR must be auto, cpu or cuda, not '$FLAVOR_WANTED'" ;; esac
[ -f "$CONSTRAINTS" ] || die "constraints file not found: $CONSTRAINTS (AA_DET_CONSTRAINTS)"
MMCV_VER=$(sed -n 's/^mmcv==\([^ ;#]*\).*/\1/p' "$CONSTRAINTS")
[ -n "$MMCV_VER" ] || die "no 'mmcv==X' pin in $CONSTRAINTS"
TORCH_PIN=$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' "$CONSTRAINTS")   # empty: torch not pinned
# the requirement files setup.py reads for the install below (its tests extra)
REQS=("$ROOT"/requirements/{runtime,mminstall,cls,vis,tests}.txt)
KEY=$({ cat "$CONSTRAINTS" "$ROOT/setup.py" "${REQS[@]}" "${BASH_SOURCE[0]}"; echo "$TORCH_INDEX"; } | sha256sum | cut -c1-16)
STAMP="$VENV/.aa_det_env"   # "<KEY> <flavour> <arch>", then "wheel=<cached wheel dir>", "constraints=<file>"
PY_TAG=                     # set by read_venv

# ---- helpers -----------------------------------------------------------------------------------

# The nvcc torch's extension builder uses: $CUDA_HOME/bin/nvcc (or $CUDA_PATH/...), else from PATH.
find_nvcc() {
  local home=${CUDA_HOME:-${CUDA_PATH:-}}
  if [ -n "$home" ]; then
    if [ -x "$home/bin/nvcc" ]; then echo "$home/bin/nvcc"; fi
  else
    command -v nvcc || true
  fi
}

# Compute capabilities of the GPUs torch sees ("8.0;9.0"), empty if none. torch is imported (seconds)
# only where NVIDIA device files exist; without them no GPU can be visible.
gpu_archs() {
  nvidia_devices || return 0
  "$VENV/bin/python" -c 'import torch; c = torch.cuda
print(";".join(sorted({"%d.%d" % c.get_device_capability(i) for i in range(c.device_count())}))
      if c.is_available() else "")' 2>/dev/null || true
}

nvidia_devices() {
  local f
  for f in /dev/nvidia[0-9]* /dev/dxg; do if [ -e "$f" ]; then return 0; fi; done
  return 1
}

# Which ops mmcv gets: sets FLAVOR (cpu|cuda), NVCC, GPUS, ARCH_LIST ("8.0;9.0", for
# TORCH_CUDA_ARCH_LIST) and ARCH (the same as a name part, "8.0_9.0"; "-" for cpu; empty for cuda
# without a known architecture). auto picks cuda when torch sees a GPU and nvcc is found, or when a
# CUDA build for these GPUs is already installed or cached (nvcc is needed only to build).
resolve_target() {
  FLAVOR=cpu ARCH=- ARCH_LIST= GPUS= NVCC=$(find_nvcc)
  if [ "$FLAVOR_WANTED" = cpu ]; then return 0; fi
  if [ "$FLAVOR_WANTED" = auto ] || [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then GPUS=$(gpu_archs); fi
  if [ "$FLAVOR_WANTED" = auto ] && [ -z "$GPUS" ]; then return 0; fi
  ARCH_LIST=$(echo "${TORCH_CUDA_ARCH_LIST:-$GPUS}" | tr ' ,;' '\n\n\n' | sed '/^$/d' | sort -u | paste -sd';')
  ARCH=$(echo "$ARCH_LIST" | tr ';' '_' | tr -c 'A-Za-z0-9.+_\n' '-')
  if [ "$FLAVOR_WANTED" = auto ] && [ -z "$NVCC" ] && ! cuda_build_ready; then
    ARCH=- ARCH_LIST=
    return 0
  fi
  FLAVOR=cuda
}

# auto without nvcc: is a CUDA build for these GPUs installed (stamp) or cached?
cuda_build_ready() {
  if [ "$(head -n1 "$STAMP" 2>/dev/null)" = "$KEY cuda $ARCH" ]; then return 0; fi
  if [ -z "$PY_TAG" ]; then read_venv; fi
  ls "$(wheel_dir cuda)"/mmcv-*.whl >/dev/null 2>&1
}

# What the venv holds, read without importing torch: PY_TAG (cp311), TORCH_VER ("2.14.1+cu130",
# "-" if absent), TORCH_CUDA (torch's CUDA version, "None" for a CPU build), PY_INCLUDE (Python.h dir),
# CXX_STD: the C++ standard torch's extension builder compiles with (c++20 for torch 2.14, c++17 for
# torch 2.1; c++17, the least any supported torch needs, while torch is absent).
read_venv() {
  local info
  info=$("$VENV/bin/python" -c 'import importlib.util, os, sys, sysconfig
spec, ns, std = importlib.util.find_spec("torch"), {"__version__": "-", "cuda": "-"}, "c++17"
if spec and spec.origin:
    root = os.path.dirname(spec.origin)
    exec(open(os.path.join(root, "version.py")).read(), ns)
    if "-std=c++20" in open(os.path.join(root, "utils", "cpp_extension.py")).read():
        std = "c++20"
print("cp%d%d" % sys.version_info[:2], ns["__version__"], ns["cuda"], std, sysconfig.get_paths()["include"])')
  read -r PY_TAG TORCH_VER TORCH_CUDA CXX_STD PY_INCLUDE <<<"$info"
}

# A cuda build needs a torch built for CUDA, an nvcc of the same CUDA major version (torch's
# extension builder refuses another one, after minutes of downloads) and known GPU architectures.
check_cuda_toolkit() {
  if [ "$FLAVOR" != cuda ]; then return 0; fi
  [ -n "$NVCC" ] || die "a CUDA build of mmcv needs the CUDA toolkit's nvcc: none $( [ -n "${CUDA_HOME:-${CUDA_PATH:-}}" ] && echo "in ${CUDA_HOME:-$CUDA_PATH}/bin (CUDA_HOME)" || echo "on PATH"); install the toolkit, or build CPU-only ops with AA_DET_FLAVOR=cpu"
  [ "$TORCH_CUDA" != None ] || die "torch $TORCH_VER is a CPU-only build: no CUDA ops can be built against it (AA_DET_FLAVOR=cpu, or a CUDA torch via AA_DET_TORCH_INDEX_URL in a new venv; README)"
  local nv
  nv=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1)
  [ -n "$nv" ] || die "cannot read a CUDA version from '$NVCC --version'"
  if [ "${nv%%.*}" != "${TORCH_CUDA%%.*}" ]; then
    die "nvcc $nv ($NVCC) does not match torch $TORCH_VER, built for CUDA $TORCH_CUDA: torch builds CUDA extensions only with the same CUDA major version. Fix: put a CUDA ${TORCH_CUDA%%.*}.x nvcc first on PATH (or set CUDA_HOME); or use a torch built for CUDA ${nv%%.*}: rm -rf $VENV && AA_DET_TORCH_INDEX_URL=https://download.pytorch.org/whl/cu${nv%%.*}X bash tools/env/setup_env.sh (cu${nv%%.*}X: a CUDA ${nv%%.*} variant pytorch.org offers for torch ${TORCH_VER%%+*}); or build CPU-only ops: AA_DET_FLAVOR=cpu"
  fi
  [ -n "$ARCH" ] || die "AA_DET_FLAVOR=cuda but torch sees no GPU: set TORCH_CUDA_ARCH_LIST to the architectures to build for (e.g. 9.0 for H100)"
}

# Building mmcv needs Python's headers and a C++ compiler that accepts torch's standard ($CXX_STD).
check_build_tools() {
  local pyver="${PY_TAG:2:1}.${PY_TAG:3}" cxx=${CXX:-c++} probe
  [ -f "$PY_INCLUDE/Python.h" ] || die "no Python.h in $PY_INCLUDE: building mmcv needs Python's headers (Debian/Ubuntu: apt-get install python$pyver-dev)"
  if [ "$CXX_STD" = c++20 ]; then
    probe='#include <concepts>\n#if __cplusplus < 202002L\n#error\n#endif\ntemplate <class T> concept Any = true;\nint main() {}\n'
  else
    probe='#include <optional>\n#if __cplusplus < 201703L\n#error\n#endif\nstd::optional<int> x;\nint main() {}\n'
  fi
  printf "$probe" | $cxx "-std=$CXX_STD" -x c++ -fsyntax-only - >/dev/null 2>&1 ||
    die "C++ compiler '$cxx' (\$CXX, default c++) is missing or does not accept -std=$CXX_STD, which building mmcv against torch ${TORCH_VER/#-/$TORCH_PIN} needs (Debian/Ubuntu: apt-get install g++; GCC 10 or newer for C++20)"
}

# At least $1 GiB free where the venv lives, or one line saying what is needed and where.
check_free_disk() {
  local free_kib
  free_kib=$(df -Pk "$VENV" | awk 'NR == 2 {print $4}')
  if [ -n "$free_kib" ] && [ "$free_kib" -lt $(($1 * 1024 * 1024)) ]; then
    die "not enough disk space for torch: about $1 GiB free needed on the disk of $VENV (AA_DET_VENV), $((free_kib / 1024 / 1024)) GiB free"
  fi
}

wheel_dir() {  # [flavour]
  if [ "${1:-$FLAVOR}" = cuda ]; then
    echo "$CACHE/wheels/mmcv-$MMCV_VER-torch$TORCH_VER-$PY_TAG-cuda-arch$ARCH"
  else
    echo "$CACHE/wheels/mmcv-$MMCV_VER-torch$TORCH_VER-$PY_TAG-cpu"   # the name of earlier versions
  fi
}
have_wheel() { ls "$WHEELS"/mmcv-*.whl >/dev/null 2>&1; }

# With torch in the venv: decide the mmcv build (FLAVOR, ARCH, WHEELS); unless its wheel is cached,
# check what building it needs.
plan_mmcv() {
  resolve_target
  WHEELS=$(wheel_dir)
  if [ "$FLAVOR_WANTED" = auto ] && [ "$FLAVOR" = cpu ] && [ -n "$GPUS" ]; then
    say "note: torch sees a GPU but there is no nvcc: mmcv gets CPU ops only; for GPU runs install the CUDA toolkit and run this again"
  fi
  if have_wheel; then return 0; fi
  check_cuda_toolkit
  check_build_tools
}

# During the build, one line a minute: elapsed time and compiled files (out of the sources).
heartbeat() {
  local src=$1 start=$SECONDS total
  total=$(ls "$src"/mmcv/ops/csrc/pytorch/*.cpp "$src"/mmcv/ops/csrc/pytorch/cpu/*.cpp 2>/dev/null | wc -l)
  if [ "$FLAVOR" = cuda ]; then
    total=$((total + $(ls "$src"/mmcv/ops/csrc/pytorch/cuda/*.cu "$src"/mmcv/ops/csrc/pytorch/cuda/*.cpp 2>/dev/null | wc -l)))
  fi
  while sleep 60 </dev/null >/dev/null 2>&1; do
    say "still building mmcv: $(((SECONDS - start) / 60)) min, $(find "$src" -name '*.o' | wc -l)/$total files compiled"
  done
}

# ---- fast path: nothing changed since the last successful run ------------------------------------
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ]; then
  resolve_target
  if [ "$(head -n1 "$STAMP")" = "$KEY $FLAVOR $ARCH" ]; then exit 0; fi
fi

# ---- 1. the venv --------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH; set AA_DET_PYTHON"
  if ! "$PYTHON" -c 'import venv, ensurepip; ensurepip.version()' >/dev/null 2>&1; then
    pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3)
    die "$PYTHON cannot create a venv with pip: no ensurepip module (Debian/Ubuntu: apt-get install python$pyver-venv)"
  fi
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PIP_NOQ=("$VENV/bin/python" -m pip --disable-pip-version-check)
PIP=("${PIP_NOQ[@]}" -q)
PIN=(-c "$CONSTRAINTS")

# ---- 2. checks before any download --------------------------------------------------------------
# If the venv's torch satisfies the pin, the install below keeps it: the mmcv build can be planned
# and checked now. A venv set up with other pins (another stack's, e.g. .venv-torch2.1 without its
# AA_DET_CONSTRAINTS) keeps its torch: these pins would replace it, GBs of downloads and that stack gone.
# Otherwise a build is certain when no wheel of this mmcv, torch pin and python is cached in any
# flavour, so its tools are checked now; the plan follows the torch install.
read_venv
TORCH_KEPT=0
SET_UP_WITH=$(sed -n 's/^constraints=//p' "$STAMP" 2>/dev/null || true)
if [ "$TORCH_VER" != - ] && { [ -z "$TORCH_PIN" ] || [ "$TORCH_PIN" = "$TORCH_VER" ] || [ "$TORCH_PIN" = "${TORCH_VER%%+*}" ]; }; then
  TORCH_KEPT=1
  plan_mmcv
elif [ "$TORCH_VER" != - ] && [ -n "$SET_UP_WITH" ] && [ "$SET_UP_WITH" != "$CONSTRAINTS" ]; then
  die "$VENV (AA_DET_VENV) holds torch $TORCH_VER, set up with $SET_UP_WITH; $CONSTRAINTS (AA_DET_CONSTRAINTS) pins torch $TORCH_PIN and would replace it: to use this venv set AA_DET_CONSTRAINTS=$SET_UP_WITH; for torch $TORCH_PIN set AA_DET_VENV to another folder, or remove $VENV"
elif ! ls "$CACHE/wheels/mmcv-$MMCV_VER-torch$TORCH_PIN"*"-$PY_TAG-"*/mmcv-*.whl >/dev/null 2>&1; then
  check_build_tools
fi
# torch from PyPI is a CUDA build: about 6 GB in the venv, plus its download while it installs
if [ "$TORCH_KEPT" = 0 ]; then check_free_disk 8; fi

# ---- 3. torch -----------------------------------------------------------------------------------
TORCH_ARGS=("${PIN[@]}" 'setuptools<82' wheel ninja torch torchvision)
if [ -n "$TORCH_INDEX" ]; then TORCH_ARGS+=(--extra-index-url "$TORCH_INDEX"); fi
BEFORE=$TORCH_VER
if [ "$TORCH_KEPT" = 1 ]; then
  say "checking torch, torchvision and build tools"
  "${PIP[@]}" install "${TORCH_ARGS[@]}"
else
  say "installing torch, torchvision and build tools (a few GB to download with torch's CUDA libraries)"
  # not -q: pip's progress bars show; --no-cache-dir: the GB of wheels leave the disk once installed
  "${PIP_NOQ[@]}" install --no-cache-dir "${TORCH_ARGS[@]}"
fi
read_venv
if [ "$TORCH_KEPT" = 0 ] || [ "$TORCH_VER" != "$BEFORE" ]; then plan_mmcv; fi

# ---- 4. mmcv, built once per key ----------------------------------------------------------------
if ! have_wheel; then
  say "building mmcv $MMCV_VER with ops for torch $TORCH_VER ($FLAVOR${ARCH_LIST:+, arch $ARCH_LIST}, $CXX_STD); 5-8 min on 2 cores (CPU), longer with CUDA"
  SRC=$(mktemp -d)
  HEARTBEAT=
  cleanup() { if [ -n "$HEARTBEAT" ]; then kill "$HEARTBEAT" 2>/dev/null || true; fi; rm -rf "$SRC"; }
  trap cleanup EXIT
  "${PIP[@]}" download --no-deps --no-binary :all: -d "$SRC" "mmcv==$MMCV_VER"
  tar xzf "$SRC"/mmcv-"$MMCV_VER".tar.gz -C "$SRC"
  sed -i "s/-std=c++1[47]/-std=$CXX_STD/g" "$SRC/mmcv-$MMCV_VER/setup.py"
  if [ "$FLAVOR" = cuda ]; then
    BUILD_ENV=(FORCE_CUDA=1 "TORCH_CUDA_ARCH_LIST=$ARCH_LIST")
  else
    # mmcv's setup.py adds CUDA ops whenever torch sees a GPU: hide it for a CPU-only build
    BUILD_ENV=(FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=)
  fi
  rm -rf "$WHEELS.partial" && mkdir -p "$WHEELS.partial"
  heartbeat "$SRC/mmcv-$MMCV_VER" &
  HEARTBEAT=$!
  # -g0: no debug info (Python's own CFLAGS carry -g), a faster build and a smaller wheel
  (cd "$SRC/mmcv-$MMCV_VER" && env MMCV_WITH_OPS=1 MAX_JOBS="$(nproc)" CFLAGS="-g0" "${BUILD_ENV[@]}" \
     "$VENV/bin/python" -m pip --disable-pip-version-check -q wheel --no-build-isolation --no-deps \
     -w "$WHEELS.partial" .)
  kill "$HEARTBEAT" 2>/dev/null || true
  HEARTBEAT=
  rm -rf "$WHEELS" && mv "$WHEELS.partial" "$WHEELS"
fi

# ---- 5. the rest, and the stamp -----------------------------------------------------------------
say "installing mmcv (cached wheel, $FLAVOR), mmengine, mmdet, mmpretrain (with model-index), pycocotools and aa_det"
# --force-reinstall: pip keeps an installed mmcv of the same version, even of another flavour
"${PIP[@]}" install "${PIN[@]}" --force-reinstall --no-deps "$WHEELS"/mmcv-*.whl
# the tests extra: mmengine and mmdet (mminstall.txt), mmpretrain and model-index (cls.txt: mmpretrain
# declares `modelindex`, an empty wheel on PyPI; model-index provides the module it imports),
# matplotlib and tensorboard (vis.txt), and the test tools
"${PIP[@]}" install "${PIN[@]}" --no-build-isolation -e "$ROOT[tests]"
"$VENV/bin/python" -c 'import mmcv.ops, mmdet, mmpretrain, aa_det' || { say "import check failed"; exit 1; }
printf '%s\nwheel=%s\nconstraints=%s\n' "$KEY $FLAVOR $ARCH" "$WHEELS" "$CONSTRAINTS" >"$STAMP"
say "environment ready: $VENV ($FLAVOR ops)"
