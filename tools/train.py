"""Train a detector or classifier from a config (mmdet's tools/train.py
semantics).

    .venv/bin/python tools/train.py CONFIG [--work-dir DIR] [--resume [CKPT]]
        [--amp [--amp-dtype bfloat16]] [--auto-scale-lr] [--partial-load]
        [--cfg-options k=v ...] [--launcher {none,pytorch,slurm,mpi}]

The config runs as in mmdet's own tools/train.py; the differences are
command-line and machine semantics (config_runner.load_config,
docs/detection.md): one `aa_det:` line for a bad input, bf16 autocast for --amp
on the CPU, --amp-dtype, SyncBN / gloo / DDP without device ids for a
distributed run without GPUs, what mmengine's `compile` option needs on the
installed torch, the checks before the model is built, and a barrier and the
process group destroyed after a finished distributed run. Each is what a config
cannot say (a command-line option, the machine, a check before the build); the
config itself means what it means in mmdet's tools/train.py, which runs it too:
without custom_imports importing aa_det it is refused here as there.
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'env'))
from env_check import require_env, run_cli  # noqa: E402

require_env()

from config_runner import build_runner  # noqa: E402
from config_runner import close_process_group  # noqa: E402
from config_runner import load_config  # noqa: E402
from mmengine.config import DictAction  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description='Train a model')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='automatic mixed precision: fp16 with dynamic loss scale on '
        'CUDA, bf16 autocast on the CPU')
    parser.add_argument(
        '--amp-dtype',
        choices=['float16', 'bfloat16'],
        help='with --amp on CUDA: the autocast dtype (optim_wrapper.dtype; '
        'default float16); the CPU always uses bfloat16')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale lr by total batch / auto_scale_lr.base_batch_size')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from CKPT, or from the latest checkpoint in work-dir')
    parser.add_argument(
        '--partial-load',
        action='store_true',
        help='load a load_from checkpoint that does not fit the model (its '
        'matching keys; the others keep their initialisation); without '
        'it such a checkpoint stops the run before training')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main():
    args = parse_args()
    cfg = load_config(
        args.config,
        work_dir=args.work_dir,
        cfg_options=args.cfg_options,
        launcher=args.launcher,
        amp=args.amp,
        amp_dtype=args.amp_dtype,
        auto_scale_lr=args.auto_scale_lr,
        resume=args.resume,
        partial_load=args.partial_load)
    build_runner(cfg).train()
    close_process_group()


if __name__ == '__main__':
    run_cli(main)
