"""Evaluate a checkpoint (mmdet's tools/test.py semantics; the config's
evaluator, e.g. COCO bbox mAP).

    .venv/bin/python tools/test.py CONFIG CHECKPOINT [--work-dir DIR]
        [--out results.pkl] [--show] [--show-dir DIR] [--wait-time S] [--tta]
        [--partial-load] [--cfg-options k=v ...]
        [--launcher {none,pytorch,slurm,mpi}]

Every option of mmdet's own tools/test.py, with its meaning; ours add
``--partial-load`` and the command-line and machine semantics of
``config_runner.load_config``: what a config cannot say. The config means what
it means in mmdet's tools/test.py, which runs it too (custom_imports importing
aa_det included).
"""
import argparse
import copy
import os
import os.path as osp
import sys
import warnings

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'env'))
from env_check import require_env, run_cli  # noqa: E402

require_env()

from config_runner import build_runner  # noqa: E402
from config_runner import close_process_group  # noqa: E402
from config_runner import load_config  # noqa: E402
from mmdet.engine.hooks.utils import trigger_visualization_hook  # noqa: E402
from mmengine.config import ConfigDict, DictAction  # noqa: E402

from aa_det.utils import ConfigError  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--work-dir', help='the dir to save evaluation results')
    parser.add_argument('--out', help='dump predictions to a pickle file')
    parser.add_argument(
        '--show', action='store_true', help='show prediction results')
    parser.add_argument(
        '--show-dir',
        help='directory where painted images will be saved (relative to the '
        'work_dir/timestamp folder)')
    parser.add_argument(
        '--wait-time', type=float, default=2, help='the interval of show (s)')
    parser.add_argument(
        '--tta',
        action='store_true',
        help='test-time augmentation: the config\'s tta_model and '
        'tta_pipeline, else mmdet\'s flip TTA')
    parser.add_argument(
        '--partial-load',
        action='store_true',
        help='evaluate a checkpoint that does not fit the model (its matching '
        'keys load, the others keep their initialisation); without it '
        'such a checkpoint is an error')
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


def use_tta(cfg):
    """mmdet's ``--tta``: the model wrapped in the config's ``tta_model``
    (default: ``DetTTAModel`` with NMS) and the test pipeline replaced by its
    ``tta_pipeline`` (default: the test pipeline with a flip and no flip)."""
    if 'tta_model' not in cfg:
        warnings.warn(
            'Cannot find ``tta_model`` in config, we will set it as default.')
        cfg.tta_model = dict(
            type='DetTTAModel',
            tta_cfg=dict(
                nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
    if 'tta_pipeline' not in cfg:
        warnings.warn(
            'Cannot find ``tta_pipeline`` in config, we will set it as '
            'default.')
        dataset = cfg.test_dataloader.dataset
        while 'dataset' in dataset:
            dataset = dataset['dataset']
        cfg.tta_pipeline = copy.deepcopy(dataset.pipeline)
        meta_keys = ('img_id', 'img_path', 'ori_shape', 'img_shape',
                     'scale_factor', 'flip', 'flip_direction')
        cfg.tta_pipeline[-1] = dict(
            type='TestTimeAug',
            transforms=[[
                dict(type='RandomFlip', prob=1.),
                dict(type='RandomFlip', prob=0.)
            ], [dict(type='PackDetInputs', meta_keys=meta_keys)]])
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline


def main():
    args = parse_args()
    cfg = load_config(
        args.config,
        work_dir=args.work_dir,
        cfg_options=args.cfg_options,
        launcher=args.launcher,
        partial_load=args.partial_load)
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint file not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        cfg = trigger_visualization_hook(cfg, args)
    if args.tta:
        use_tta(cfg)
    if args.out:
        cfg.test_evaluator = ([cfg.test_evaluator] if isinstance(
            cfg.test_evaluator, dict) else list(cfg.test_evaluator))
        cfg.test_evaluator.append(
            dict(type='DumpDetResults', out_file_path=args.out))
    build_runner(cfg, splits=('test', )).test()
    close_process_group()


if __name__ == '__main__':
    run_cli(main)
