#!/usr/bin/env bash
# Multi-process training with torchrun:  bash tools/dist_train.sh CONFIG GPUS [train.py args]
# Without CUDA the processes use gloo on the CPU (tools/train.py chooses the backend).
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${AA_DET_VENV:-$ROOT/.venv}/bin/python
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" --nproc_per_node="$GPUS" --master_port="$PORT" \
    "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "${@:3}"
