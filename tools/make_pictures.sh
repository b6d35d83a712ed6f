#!/usr/bin/env bash
# Regenerates the README's pictures (docs/img/*.png) with the repository's own tools:
#   1. trains the demo detector (AA-ResNet-18, demo/detection_demo.py) and a GSA-ResNet-26 one on the
#      same generated shapes and recipe (seed 0, 12 epochs each; about 4 + 2 minutes on 2 CPU cores),
#   2. draws detections of the AA detector on four validation images (demo/vis_detections.py),
#   3. draws per-head attention maps of one AA layer and one GSA layer (demo/vis_attention.py),
#   4. plots the benchmark ratios to ResNet-50 from docs/data/*.json (tools/analysis_tools/plot_ratios.py).
#
#   bash tools/make_pictures.sh
#
# AA_DET_PICTURES_OUT (default docs/img) and AA_DET_PICTURES_WORK (default work_dirs/pictures) move
# the outputs and the trainings; a finished training in the work dir is reused.
# AA_DET_PICTURES_PYTHON runs that interpreter instead of setting up the environment.
# On a machine that other jobs share, OMP_NUM_THREADS=1 keeps torch's threads from oversubscribing the
# cores (a demo iteration took 3.4 s instead of 0.75 s with three jobs on 2 cores).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=$(realpath -m "${AA_DET_PICTURES_OUT:-$ROOT/docs/img}")
WORK=$(realpath -m "${AA_DET_PICTURES_WORK:-$ROOT/work_dirs/pictures}")
if [[ -n "${AA_DET_PICTURES_PYTHON:-}" ]]; then
    PY=$AA_DET_PICTURES_PYTHON
else
    bash "$ROOT/tools/env/setup_env.sh"
    PY=$(realpath -m "${AA_DET_VENV:-$ROOT/.venv}")/bin/python
fi
mkdir -p "$OUT" "$WORK"
DATA=$WORK/shapes
AA_CFG=configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py
GSA_CFG=configs/retinanet/retinanet_gsa-r26-scratch_fpn_1xb8-ms-12e_shapes.py

train() {  # config work_dir
    if [[ ! -f "$2/epoch_12.pth" ]]; then
        "$PY" demo/detection_demo.py --config "$1" --data-root "$DATA" --work-dir "$2" \
            --cfg-options randomness.seed=0
    fi
}
train "$AA_CFG" "$WORK/aa"
train "$GSA_CFG" "$WORK/gsa"

# detections: the AA detector on the first four validation images, tiled into one PNG
rm -rf "$WORK/vis" && mkdir -p "$WORK/vis/images"
for f in $(ls "$DATA/val" | sort | head -4); do cp "$DATA/val/$f" "$WORK/vis/images/"; done
"$PY" demo/vis_detections.py "$AA_CFG" "$WORK/aa/epoch_12.pth" "$WORK/vis/images" --out-dir "$WORK/vis/out" \
    --score-thr 0.3 --cfg-options test_dataloader.dataset.data_root="$DATA/"
"$PY" - "$WORK/vis/out" "$OUT/detections.png" <<'EOF'
import glob, os.path as osp, sys
from PIL import Image
tiles = [Image.open(p).convert('RGB') for p in sorted(glob.glob(osp.join(sys.argv[1], '*.png')))[:4]]
tiles = [t.resize((2 * t.width, 2 * t.height), Image.NEAREST) for t in tiles]  # 128 px images, drawn at 2x
w, h = max(t.width for t in tiles), max(t.height for t in tiles)
sheet = Image.new('RGB', (len(tiles) * w + (len(tiles) - 1) * 4, h), 'white')
for i, tile in enumerate(tiles):
    sheet.paste(tile, (i * (w + 4), 0))
sheet.save(sys.argv[2], optimize=True)
EOF

# attention maps: one AA layer (stage 3, second block) and one GSA layer (stage 3, second block),
# three query pixels on a generated scene of 256 px (twice the training crops)
"$PY" demo/vis_attention.py "$AA_CFG" "$WORK/aa/epoch_12.pth" --layer layer3.1.conv1 --size 256 \
    --out "$OUT/attention_aa.png"
"$PY" demo/vis_attention.py "$GSA_CFG" "$WORK/gsa/epoch_12.pth" --layer layer3.1.conv2 --size 256 \
    --positions 0.3,0.3 0.5,0.5 --out "$OUT/attention_gsa.png"

# benchmark ratios to ResNet-50, drawn from the benchmarks' output files in docs/data/
"$PY" tools/analysis_tools/plot_ratios.py --out "$OUT/benchmark_ratios.png"
# keep each PNG well under 300 KB: a 128-colour palette (the attention overlays are photographic)
"$PY" - "$OUT"/detections.png "$OUT"/attention_aa.png "$OUT"/attention_gsa.png "$OUT"/benchmark_ratios.png <<'EOF'
import sys
from PIL import Image
for path in sys.argv[1:]:
    Image.open(path).convert('RGB').quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
EOF
ls -l "$OUT"/detections.png "$OUT"/attention_aa.png "$OUT"/attention_gsa.png "$OUT"/benchmark_ratios.png
