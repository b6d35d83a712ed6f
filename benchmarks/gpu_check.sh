#!/usr/bin/env bash
# The GPU machine's one call (docs/benchmarks.md, "On a GPU"), within an overall deadline, most telling first:
#   1. the CUDA tests (pytest -m cuda: the kernels against their references, a compile smoke test of one AA and
#      one GSA layer);
#   2. eager train steps (detection_speed.py --amp), fp16 then bf16 autocast: ResNet-50, AA-ResNet-50 and
#      GSA-ResNet-50, with torch.profiler's kernels per step and the GPU's busy fraction; after each dtype's,
#      AA and GSA with the layers of another commit (the folder of benchmarks/prepare_baseline.sh, 123e005 by
#      default) when that folder exists;
#   3. AA's attention kernels alone (attention_kernels.py): one forward + backward of stage 3 of AA-ResNet-50 at
#      640x640 batch 8 in bf16 with FlexAttention, with SDPA's fold and materialized, each also without the
#      relative logits, beside the 3x3 convolution it augments (what the position term and the padding cost);
#   4. the backbone compiled (fullgraph=True, CUDA graphs: mode reduce-overhead), bf16 then fp16: compile time,
#      graphs, graph breaks, recompilations, CUDA-graph skips and kernels per step.
# Every speed run is one step: one model in one setting (a detection_speed.py process per model). A step's
# estimated cost is the longest finished step of its kind so far, or a fixed guess before one finished; a step
# that does not fit in what is left of GPU_CHECK_DEADLINE seconds (counted from the start, set-up included) is
# not started, and each runs under `timeout` of its own limit or the time left, whichever is shorter.
# OUTDIR ends with gpu_check.tar.gz (every log, JSON and profiler table), summary.md and summary.json;
# summary.md (benchmarks/gpu_check_summary.py) is printed last.
#
#   bash benchmarks/prepare_baseline.sh                        # here: .baseline/ with 123e005's layers
#   GPU_CHECK_DEADLINE=420 bash benchmarks/gpu_check.sh OUTDIR  # on the GPU machine, .gpu/ and .baseline/ carried
#   GPU_CHECK_DEADLINE=120 bash benchmarks/gpu_check.sh OUTDIR  # dry run without CUDA: 128 px, 1 step, bf16,
#                                                               # compiled with dynamo's eager backend
# Other settings: GPU_CHECK_PARTS (default "tests eager baseline kernels compiled": e.g. "compiled" alone for a second
# call on the still warm machine), GPU_CHECK_MODELS, GPU_CHECK_DTYPES, GPU_CHECK_SIZE, GPU_CHECK_COMPILE_MODE,
# GPU_CHECK_COMPILE_BACKEND, GPU_CHECK_BASELINE (the folder; default .baseline).
set -u
mkdir -p "${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}"
OUT=$(cd "$1" && pwd)
WORK=$OUT/gpu_check  # archived, then removed; what a call cut short leaves behind
rm -rf "$WORK" "$OUT/gpu_check.tar.gz" "$OUT/summary.md" "$OUT/summary.json"
mkdir -p "$WORK"
cd "$(dirname "$0")/.."
if [ -f .gpu/setup.sh ] && command -v nvidia-smi > /dev/null; then
  source .gpu/setup.sh > "$WORK/setup.log" 2>&1
  PY=python3
else
  PY=.venv/bin/python
fi
# One line: the device (cuda or cpu), torch's version, the device's name.
read -r DEV TORCH NAME < <($PY -c 'import platform, torch
cuda = torch.cuda.is_available()
print("cuda" if cuda else "cpu", torch.__version__, torch.cuda.get_device_name() if cuda else platform.machine())')
[ -n "${DEV:-}" ] || { echo "gpu_check: $PY cannot import torch; every step will fail" >&2; DEV=cpu TORCH=? NAME=?; }
COMMIT=$(git rev-parse --short HEAD 2> /dev/null || echo current)
BASELINE=${GPU_CHECK_BASELINE:-.baseline}
BASE_REV=$(head -c 7 "$BASELINE/REVISION" 2> /dev/null || echo baseline)
if [ "$DEV" = cuda ]; then
  DEADLINE=${GPU_CHECK_DEADLINE:-420} SIZE=${GPU_CHECK_SIZE:-640} DTYPES=${GPU_CHECK_DTYPES:-float16 bfloat16}
  MODE=${GPU_CHECK_COMPILE_MODE:-reduce-overhead} BACKEND=${GPU_CHECK_COMPILE_BACKEND:-inductor}
  TIMING=(--steps 12 --warmup 3)
  KERNELS=(--sides 40 --batches 8 --dtype bfloat16 --impls flex flex:none sdpa sdpa:none materialized)
  # by kind of step: its estimate before one of its kind finished, and its time limit, in seconds
  EST_TESTS=90 LIMIT_TESTS=240 EST_EAGER=30 LIMIT_EAGER=120 EST_KERNELS=60 LIMIT_KERNELS=150
  EST_COMPILED=150 LIMIT_COMPILED=240
else
  DEADLINE=${GPU_CHECK_DEADLINE:-900} SIZE=${GPU_CHECK_SIZE:-128} DTYPES=${GPU_CHECK_DTYPES:-bfloat16}
  MODE=${GPU_CHECK_COMPILE_MODE:-default} BACKEND=${GPU_CHECK_COMPILE_BACKEND:-eager}
  TIMING=(--steps 1 --warmup 0 --infer-size "$SIZE" "$SIZE")
  KERNELS=(--sides 16 --batches 1 --dtype float32 --impls blocked blocked:none sdpa sdpa:none materialized)
  EST_TESTS=30 LIMIT_TESTS=300 EST_EAGER=20 LIMIT_EAGER=300 EST_KERNELS=20 LIMIT_KERNELS=120
  EST_COMPILED=25 LIMIT_COMPILED=600
fi
RESERVE=15  # seconds kept for the summary, the archive and a killed step's exit
read -r -a MODELS <<< "${GPU_CHECK_MODELS:-ResNet-50 AA-ResNet-50 GSA-ResNet-50}"
PARTS=" ${GPU_CHECK_PARTS:-tests eager baseline kernels compiled} "
read -r -a DTYPES <<< "$DTYPES"
printf '%s\n' "device=$DEV" "device_name=$NAME" "torch=$TORCH" "commit=$COMMIT" "baseline=$BASE_REV" \
  "deadline_s=$DEADLINE" "size=$SIZE" "compile=$MODE,$BACKEND,fullgraph=True" > "$WORK/device.txt"
echo "gpu_check: $NAME, torch $TORCH, $COMMIT (baseline $BASE_REV), deadline $DEADLINE s"

declare -A LONGEST  # the longest finished step of each kind, in seconds
step() {  # NAME KIND ESTIMATE LIMIT COMMAND...: COMMAND's output in WORK/NAME.log, its line in WORK/steps.tsv
  local name=$1 kind=$2 est=${LONGEST[$2]:-$3} limit=$4 status t0=$SECONDS rc
  shift 4
  local left=$((DEADLINE - RESERVE - SECONDS))
  if ((left < est || left < 1)); then
    status='skipped: deadline'
  else
    ((limit > left)) && limit=$left
    timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    rc=$?
    case $rc in
      0) status=ok ;;
      124 | 137) status="timeout after $limit s" ;;
      *) status="failed (exit $rc)" ;;
    esac
    if ((rc == 0 && SECONDS - t0 > ${LONGEST[$kind]:-0})); then LONGEST[$kind]=$((SECONDS - t0)); fi
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$kind" "$status" "$((SECONDS - t0))" "$est" >> "$WORK/steps.tsv"
  echo "$name: $status, $((SECONDS - t0)) s (estimate $est s, $((DEADLINE - SECONDS)) s left)"
}

speed() {  # MODE(eager/compiled) DTYPE LAYERS(current/baseline) MODEL: one detection_speed.py step
  local mode=$1 dtype=$2 layers=$3 model=$4
  local name="${mode}_${dtype}_${layers}_${model}" args=()
  [ "$mode" = compiled ] && args+=(--compile "$MODE" --compile-backend "$BACKEND" --no-infer)
  [ "$layers" = baseline ] && args+=(--package-root "$BASELINE" --config-root "$BASELINE")
  if [ "$layers" = baseline ] && [ ! -d "$BASELINE/aa_det" ]; then
    printf '%s\t%s\t%s\t0\t0\n' "$name" "$mode" "skipped: no $BASELINE (benchmarks/prepare_baseline.sh)" \
      >> "$WORK/steps.tsv"
    return
  fi
  local est=$EST_EAGER limit=$LIMIT_EAGER
  [ "$mode" = compiled ] && est=$EST_COMPILED limit=$LIMIT_COMPILED
  step "$name" "$mode" "$est" "$limit" $PY benchmarks/detection_speed.py --device "$DEV" --models "$model" --amp \
    --amp-dtype "$dtype" --size "$SIZE" "${TIMING[@]}" "${args[@]}" --profile "$WORK/profile" \
    --json "$WORK/$name.json"
  if [ -f "$WORK/profile/$model.txt" ]; then mv "$WORK/profile/$model.txt" "$WORK/$name.profile.txt"; fi
}

part() { [[ $PARTS == *" $1 "* ]]; }  # NAME: whether GPU_CHECK_PARTS names it

part tests && step tests tests "$EST_TESTS" "$LIMIT_TESTS" $PY -m pytest -q -rs -p no:cacheprovider -m cuda \
  tests/test_cuda_path.py tests/test_relative_attention.py tests/test_low_precision.py
for dtype in "${DTYPES[@]}"; do
  part eager && for model in "${MODELS[@]}"; do speed eager "$dtype" current "$model"; done
  part baseline && for model in "${MODELS[@]}"; do
    [ "$model" != ResNet-50 ] && speed eager "$dtype" baseline "$model"
  done
done
# AA-ResNet-50's stage 3: 8 heads of 20 key and 3 value channels, the 256 -> 256 convolution it augments
part kernels && step kernels kernels "$EST_KERNELS" "$LIMIT_KERNELS" $PY benchmarks/attention_kernels.py \
  --device "$DEV" --value-dim 3 --conv 256 "${KERNELS[@]}" --json "$WORK/kernels.json"
# Compiled last (the longest steps), the last dtype first (bf16: the dtype of the compiled target), the attention
# models before ResNet-50 (the first model).
part compiled && for ((i = ${#DTYPES[@]} - 1; i >= 0; i--)); do
  for model in "${MODELS[@]:1}" "${MODELS[0]}"; do speed compiled "${DTYPES[i]}" current "$model"; done
done
rmdir "$WORK/profile" 2> /dev/null

if ! $PY benchmarks/gpu_check_summary.py "$WORK" --elapsed "$SECONDS" --md "$OUT/summary.md" \
  --json "$OUT/summary.json"; then
  { echo "gpu_check_summary.py failed; the steps (name, kind, status, seconds, estimate):"; cat "$WORK/steps.tsv"; } \
    > "$OUT/summary.md"
fi
cp "$OUT"/summary.* "$WORK/"
tar -czf "$OUT/gpu_check.tar.gz" -C "$OUT" gpu_check && rm -rf "$WORK"
echo "gpu_check: $OUT/gpu_check.tar.gz, $SECONDS s in all"
echo
cat "$OUT/summary.md"
