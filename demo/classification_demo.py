"""Classification demo: generate shapes in mmpretrain's folder layout, pretrain
a narrow AA-ResNet-18 from scratch with mmpretrain's classifier, report top-1
(configs/imagenet/aa-resnet18_1xb32-20e_shapes-cls.py).

    .venv/bin/python demo/classification_demo.py [--work-dir DIR]
        [--cfg-options k=v ...]

The checkpoint it writes (WORK_DIR/epoch_20.pth) loads into a detector's
backbone with init_cfg=dict(type='Pretrained', checkpoint=...,
prefix='backbone.').
"""
import argparse
import os.path as osp
import sys

sys.path[1:1] = [
    osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', sub)
    for sub in ('', 'env')
]
from env_check import require_env, run_cli  # noqa: E402

require_env()

from config_runner import build_runner, load_config  # noqa: E402
from mmengine.config import DictAction  # noqa: E402
from synthetic_shapes import generate_shapes_folder  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument(
        '--config',
        default=osp.join(
            ROOT, 'configs/imagenet/aa-resnet18_1xb32-20e_shapes-cls.py'))
    parser.add_argument(
        '--data-root', default=osp.join(ROOT, 'data/shapes_cls'))
    parser.add_argument(
        '--work-dir', default=osp.join(ROOT, 'work_dirs/demo_shapes_cls'))
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = parser.parse_args()
    # DATA_ROOT/{train,val}/<class>/*.png
    generate_shapes_folder(args.data_root)
    options = {
        f'{split}_dataloader.dataset.data_root': args.data_root
        for split in ('train', 'val', 'test')
    }
    options['train_cfg.val_interval'] = 10**6
    options.update(args.cfg_options or {})
    runner = build_runner(
        load_config(args.config, work_dir=args.work_dir, cfg_options=options))
    runner.train()
    metrics = runner.test()
    classes = runner.test_dataloader.dataset.metainfo['classes']
    print(
        f'\nClassification demo: top-1 = {metrics["accuracy/top1"]:.1f}% '
        f'(chance {100 / len(classes):.1f}%), checkpoints in {args.work_dir}')


if __name__ == '__main__':
    run_cli(main)
