#!/usr/bin/env bash
# Exports the layers of another commit (its aa_det package and configs) into an untracked folder that
# benchmarks/gpu_check.sh times beside this checkout's (detection_speed.py --package-root, --config-root):
#
#   bash benchmarks/prepare_baseline.sh [REV [DIR]]     # defaults: 123e005 .baseline (DIR from the repository root)
#
# DIR is emptied first, holds REV's full hash in DIR/REVISION and is listed in .git/info/exclude, so that git
# ignores it and the GPU machine's copy of the checkout can carry it (the device tool's `carry`).
set -eu
REV=${1:-123e005}
DIR=${2:-.baseline}
cd "$(dirname "$0")/.."
COMMIT=$(git rev-parse --verify "$REV^{commit}")
if [ "$(realpath -m "$DIR")" = / ] || [ -n "$(git ls-files -- "$DIR" 2> /dev/null | head -1)" ]; then
  echo "prepare_baseline.sh: $DIR holds tracked files; give a new folder" >&2
  exit 1
fi
rm -rf "$DIR"
mkdir -p "$DIR"
git archive "$COMMIT" aa_det configs | tar -x -C "$DIR"
echo "$COMMIT" > "$DIR/REVISION"
case $DIR in
  /* | ..*) ;;  # outside the checkout: nothing for git to ignore
  *)
    EXCLUDE=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$EXCLUDE")"
    grep -qxF "/${DIR%/}/" "$EXCLUDE" 2> /dev/null || echo "/${DIR%/}/" >> "$EXCLUDE"
    ;;
esac
echo "$DIR: aa_det and configs of ${COMMIT:0:7} ($(du -sh "$DIR" | cut -f1))"
