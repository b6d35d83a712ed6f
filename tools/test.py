"""Evaluate a checkpoint (mmdet's tools/test.py semantics; the config's evaluator, e.g. COCO bbox mAP).

    .venv/bin/python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--partial-load]
        [--cfg-options k=v ...] [--launcher {none,pytorch,slurm,mpi}]
"""
import argparse
import os
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'env'))
from env_check import require_env, run_cli  # noqa: E402

require_env()

from mmengine.config import DictAction  # noqa: E402

from aa_det.utils import ConfigError  # noqa: E402
from config_runner import build_runner, close_process_group, load_config  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='the dir to save evaluation results')
    parser.add_argument('--out', help='dump predictions to a pickle file')
    parser.add_argument('--partial-load', action='store_true',
                        help='evaluate a checkpoint that does not fit the model (its matching keys load, the '
                             'others keep their initialisation); without it such a checkpoint is an error')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config settings, key=value')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def main():
    args = parse_args()
    cfg = load_config(args.config, work_dir=args.work_dir, cfg_options=args.cfg_options,
                      launcher=args.launcher, partial_load=args.partial_load)
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint file not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    if args.out:
        cfg.test_evaluator = [cfg.test_evaluator] if isinstance(cfg.test_evaluator, dict) \
            else list(cfg.test_evaluator)
        cfg.test_evaluator.append(dict(type='DumpDetResults', out_file_path=args.out))
    build_runner(cfg, splits=('test',)).test()
    close_process_group()


if __name__ == '__main__':
    run_cli(main)
