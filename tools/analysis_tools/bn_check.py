"""Evaluate a checkpoint twice, with BatchNorm's running statistics and with
each test batch's own, and name the BatchNorms whose running statistics are
furthest from the inputs they see.

    .venv/bin/python tools/analysis_tools/bn_check.py CONFIG CHECKPOINT
        [--top 10] [--work-dir DIR] [--cfg-options k=v ...]

The first evaluation is what tools/test.py reports (eval mode, running
statistics); the second lets every BatchNorm normalise with the statistics of
the test batch (test_dataloader.batch_size images) and changes no weight or
statistic. A large gap between the two mAPs has a name in the table that
follows: per BatchNorm, how many times one forward applies it (more than once:
shared by the FPN levels), and what its running statistics make of the inputs
it sees, averaged over the test set: the RMS over channels of the normalised
input's mean (0 when the running mean fits) and the factor by which its
standard deviation is off (x1.00 when the running variance fits).
docs/detection.md, "BatchNorm in the head", reads an example.
"""
import argparse
import os.path as osp
import sys

TOOLS = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path[1:1] = [TOOLS, osp.join(TOOLS, 'env')]
from env_check import require_env, run_cli  # noqa: E402

require_env()

from bn_statistics import RunningStatisticsGap, batch_statistics  # noqa: E402
from config_runner import build_runner, load_config  # noqa: E402
from mmengine.config import DictAction  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.model import is_model_wrapper  # noqa: E402

from aa_det.utils import ConfigError  # noqa: E402


class TestEpochContext(Hook):
    """Open ``context`` for the test epoch only: not while the hooks that start
    a run (the head-BatchNorm check runs the head) run the model."""

    def __init__(self, context):
        self.context = context

    def before_test_epoch(self, runner):
        self.context.__enter__()

    def after_test_epoch(self, runner, metrics=None):
        self.context.__exit__(None, None, None)


def parse_args():
    parser = argparse.ArgumentParser(
        description='mAP with running and with batch BatchNorm statistics')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--top',
        type=int,
        default=10,
        help='BatchNorms listed, furthest first')
    parser.add_argument('--work-dir', help='the dir to save logs')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value')
    return parser.parse_args()


def summary(metrics: dict) -> str:
    """The mAP / mAP_50 / mAP_75 of a detection evaluation (every metric for
    another task)."""
    keys = [
        k for k in metrics
        if k.endswith(('/bbox_mAP', '/bbox_mAP_50', '/bbox_mAP_75'))
    ] or list(metrics)
    return '  '.join(
        f'{k.split("/")[-1].replace("bbox_", "")}={metrics[k]:.3f}'
        for k in keys)


def main():
    args = parse_args()
    if args.top < 0:
        raise ConfigError(f'--top must be >= 0, not {args.top}')
    cfg = load_config(
        args.config, work_dir=args.work_dir, cfg_options=args.cfg_options)
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint file not found: {args.checkpoint}')
    cfg.load_from = args.checkpoint
    runner = build_runner(cfg, splits=('test', ))
    model = runner.model.module if is_model_wrapper(
        runner.model) else runner.model
    forwards, gap = [], RunningStatisticsGap(model)
    handle = model.register_forward_hook(lambda *_: forwards.append(1))
    runner.register_hook(TestEpochContext(gap), priority='LOWEST')
    running = runner.test()
    handle.remove()
    with batch_statistics(model):
        batch = runner.test()
    rows = gap.table()
    print(f'\nBatchNorm check of {args.checkpoint} ({len(forwards)} test '
          f'batches):')
    print(f'  running statistics (eval mode, as tools/test.py): '
          f'{summary(running)}')
    print(f'  batch statistics (each test batch\'s own):         '
          f'{summary(batch)}')
    if not rows:
        print('  the model has no BatchNorm with running statistics')
        return
    width = max(len(name) for name, *_ in rows[:args.top])
    print(
        f'BatchNorms furthest from their inputs with running statistics '
        f'({len(rows)} in all; normalised input: RMS of channel means, factor '
        f'its std is off by):')
    for name, calls, mean, scale in rows[:args.top]:
        print(f'  {name:<{width}}  applied {calls / max(len(forwards), 1):g}x '
              f'per forward  mean {mean:.2f}  std x{scale:.2f}')


if __name__ == '__main__':
    run_cli(main)
