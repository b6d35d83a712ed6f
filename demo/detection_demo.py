"""The main job on the embedded default (README: `bash tools/demo.sh`).

1. Generates the synthetic shapes detection dataset (COCO format, no download)
   in data/shapes/ (reused when it exists).
2. Trains RetinaNet + FPN with an AA-ResNet-18 backbone from scratch on it with
   the real mmengine Runner
   (configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py).
3. Evaluates with mmdet's CocoMetric (pycocotools) and prints the mAP table.

    bash tools/demo.sh [--work-dir DIR] [--resume] [--cfg-options k=v ...]
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
from synthetic_shapes import generate_shapes_coco  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(
    ROOT,
    'configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py')
METRICS = ('bbox_mAP', 'bbox_mAP_50', 'bbox_mAP_75', 'bbox_mAP_s',
           'bbox_mAP_m', 'bbox_mAP_l')


def parse_args():
    parser = argparse.ArgumentParser(
        description='Train and evaluate the demo detector')
    parser.add_argument('--config', default=CONFIG)
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data/shapes'))
    parser.add_argument(
        '--work-dir', default=osp.join(ROOT, 'work_dirs/demo_shapes'))
    parser.add_argument(
        '--resume', action='store_true', help='resume from the work dir')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args()


def main():
    args = parse_args()
    generate_shapes_coco(args.data_root)
    data_root = args.data_root.rstrip('/') + '/'
    options = {
        'train_dataloader.dataset.data_root': data_root,
        'val_dataloader.dataset.data_root': data_root,
        'test_dataloader.dataset.data_root': data_root,
        'val_evaluator.ann_file': data_root + 'annotations/instances_val.json',
        'test_evaluator.ann_file':
        data_root + 'annotations/instances_val.json',
    }
    options.update(args.cfg_options or {})
    # evaluated once, below
    options.setdefault('train_cfg.val_interval', 10**6)
    cfg = load_config(
        args.config,
        work_dir=args.work_dir,
        cfg_options=options,
        resume='auto' if args.resume else None)
    runner = build_runner(cfg)
    runner.train()
    metrics = runner.test()
    print('\nDemo result (COCO bbox, val split of the shapes dataset):')
    # mmdet's CocoMetric returns no metric when nothing was detected
    if 'coco/bbox_mAP' not in metrics:
        print('  nothing detected on the val split (mAP=0.000): train longer, '
              'or check the config')
        return
    print('  ' +
          '  '.join(f'{k.replace("bbox_", "")}={metrics[f"coco/{k}"]:.3f}'
                    for k in METRICS))


if __name__ == '__main__':
    run_cli(main)
