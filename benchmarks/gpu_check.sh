#!/usr/bin/env bash
# The GPU check, one call on the GPU machine (docs/benchmarks.md, "On a GPU"), most telling first, so that a
# call cut short still brings back the figures that matter:
#   1. detection_speed.py --amp (fp16) for ResNet-50, AA-ResNet-50 and GSA-ResNet-50, eager, with torch.profiler
#      tables of three train steps per model;
#   2. the CUDA tests (tests marked by their `cuda` skip: kernels, low precision, device policy);
#   3. the same speed run under bf16 autocast, with its profiles;
#   4. the backbone compiled (inductor), one model per process and time limit, GSA first;
#   5. the same with CUDA graphs (torch.compile mode reduce-overhead), last: what time is left.
# Results land in OUTDIR: device.txt, summary.txt, tests.log, speed_*.json / .log, profile[_bf16]/<model>.txt.
#
#   bash benchmarks/gpu_check.sh OUTDIR                  # on the GPU machine, after copying ../shared/gpu to .gpu
#   GPU_CHECK_SIZE=128 bash benchmarks/gpu_check.sh OUT  # dry run on the CPU: same steps, small crops, 1 step
#   GPU_CHECK_MODELS=ResNet-50 ...                       # fewer models (detection_speed.py --models)
# Each step has its own time limit (GPU_CHECK_LIMIT seconds), so a hung compile cannot take the rest of the run.
set -u
OUT=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if [ -f .gpu/setup.sh ] && command -v nvidia-smi > /dev/null; then
  source .gpu/setup.sh > "$OUT/setup.log" 2>&1
  PY=python3
else
  PY=.venv/bin/python
fi
if $PY -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  DEV=cuda STEPS=12 WARMUP=3 SIZE=${GPU_CHECK_SIZE:-640} LIMIT=${GPU_CHECK_LIMIT:-150}
else
  DEV=cpu STEPS=1 WARMUP=0 SIZE=${GPU_CHECK_SIZE:-128} LIMIT=${GPU_CHECK_LIMIT:-900}
fi
{ git rev-parse --short HEAD 2> /dev/null || echo unknown; $PY -c 'import torch; print(torch.__version__,
  torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")'; } > "$OUT/device.txt"
cat "$OUT/device.txt"

run() {  # NAME COMMAND...: the command's output in OUT/NAME.log, its status in the summary
  local name=$1; shift
  local t0=$SECONDS
  timeout "$LIMIT" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}

read -r -a MODELS <<< "${GPU_CHECK_MODELS:-ResNet-50 AA-ResNet-50 GSA-ResNet-50}"
SPEED=(benchmarks/detection_speed.py --device "$DEV" --amp --steps "$STEPS" --warmup "$WARMUP" --size "$SIZE")
run speed_fp16_eager $PY "${SPEED[@]}" --models "${MODELS[@]}" --json "$OUT/speed_fp16_eager.json" \
  --profile "$OUT/profile"
[ "$DEV" = cuda ] && run tests $PY -m pytest -q -rs -p no:cacheprovider tests/test_relative_attention.py \
  tests/test_low_precision.py tests/test_cuda_path.py -k "cuda"
[ "$DEV" = cuda ] && run speed_bf16_eager $PY "${SPEED[@]}" --models "${MODELS[@]}" --amp-dtype bfloat16 \
  --json "$OUT/speed_bf16_eager.json" --profile "$OUT/profile_bf16"
for ((i = ${#MODELS[@]} - 1; i >= 0; i--)); do  # GSA, AA, then ResNet-50: the compiles in question first
  m=${MODELS[i]}
  run "speed_fp16_compiled_${m}" $PY "${SPEED[@]}" --models "$m" --compile --json "$OUT/speed_fp16_compiled_${m}.json"
done
for ((i = ${#MODELS[@]} - 1; i >= 0; i--)); do  # then CUDA graphs over the compiled backbone: the step is launch-bound
  m=${MODELS[i]}
  run "speed_fp16_cudagraphs_${m}" $PY "${SPEED[@]}" --models "$m" --compile reduce-overhead \
    --json "$OUT/speed_fp16_cudagraphs_${m}.json"
done
cat "$OUT"/speed_*.log
