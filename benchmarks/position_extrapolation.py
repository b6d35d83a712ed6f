"""Detection on test images twice the training crops' size: the relative-table record on and off.

The demo recipe (RetinaNet + FPN from scratch on the generated shapes, 128 px crops, 12 epochs)
with a ResNet-18, an AA-ResNet-18 and a GSA-ResNet-26 (narrow widths; the GSA one also with its
positional sums averaged, ``attention=dict(axial_mean=True)``), each trained with several seeds.
Every trained detector is evaluated on

* ``val``: 128 px images (the training size);
* ``val_2x``: 256 px images with objects at the training images' scale, so every feature map
  is twice as long and the attention reaches offsets that never occurred in training;

once as trained ("record": offsets clip at the largest trained one, TrainedOffsetRange) and
once with the record cleared ("whole table": what the code did before the record existed; the
training itself is the same either way, since a learning pass never clips). ResNet has no
tables: both of its rows are the same evaluation, a control.

    .venv/bin/python benchmarks/position_extrapolation.py [--seeds 0 1 2] [--backbones ...] [--epochs 12]
        [--work-dir DIR]

Prints one line per (backbone, seed) and the mean and spread of the mAP per column, then, for
GSA, the scale of the unnormalised positional branch (and of the content branch) at 2x against
the training size, per stage.
"""
import argparse
import json
import os.path as osp
import statistics
import sys


ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools', 'env'))
from env_check import require_env  # noqa: E402

require_env()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmengine.runner import load_checkpoint  # noqa: E402
from PIL import Image  # noqa: E402

from aa_det.datasets import generate_shapes_coco, generate_shapes_split  # noqa: E402
from aa_det.engine import build_runner, load_config  # noqa: E402
from aa_det.models.layers import GlobalSelfAttention2d  # noqa: E402
from aa_det.models.layers.gsa import column_attention, content_attention, row_attention  # noqa: E402
from aa_det.models.layers.offset_range import TrainedOffsetRange  # noqa: E402

DEMO = osp.join(ROOT, 'configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py')
BACKBONES = {
    'ResNet-18': (dict(type='ResNet', depth=18, base_channels=32), [32, 64, 128, 256]),
    'AA-ResNet-18': (None, None),  # the demo config's own
    'GSA-ResNet-26': (dict(type='GSAResNet', depth=26, base_channels=16, attention=dict(num_heads=4)),
                      [64, 128, 256, 512]),
    'GSA-ResNet-26-mean': (dict(type='GSAResNet', depth=26, base_channels=16,
                                attention=dict(num_heads=4, axial_mean=True)), [64, 128, 256, 512]),
}


def options(data_root, seed, backbone, epochs):
    opts = {f'{s}_dataloader.dataset.data_root': data_root for s in ('train', 'val', 'test')}
    opts.update({f'{s}_evaluator.ann_file': data_root + 'annotations/instances_val.json' for s in ('val', 'test')})
    opts.update({'randomness.seed': seed, 'train_cfg.val_interval': 10 ** 6, 'train_cfg.max_epochs': epochs,
                 'default_hooks.checkpoint.interval': epochs, 'param_scheduler.1.end': epochs,
                 'param_scheduler.1.milestones': [epochs * 3 // 4, epochs * 11 // 12]})
    cfg, in_channels = BACKBONES[backbone]
    if cfg is not None:
        opts['model.backbone'] = dict(cfg, _delete_=True, frozen_stages=-1, norm_cfg=dict(type='BN'),
                                      norm_eval=False, init_cfg=None)
        opts['model.neck.in_channels'] = in_channels
    return opts


def evaluate(data_root, work_dir, seed, backbone, epochs, split, size, record):
    """COCO bbox mAP / mAP_50 of the final checkpoint on ``split`` resized to ``size``."""
    opts = options(data_root, seed, backbone, epochs)
    opts.update({'test_dataloader.dataset.ann_file': f'annotations/instances_{split}.json',
                 'test_dataloader.dataset.data_prefix.img': f'{split}/',
                 'test_evaluator.ann_file': data_root + f'annotations/instances_{split}.json'})
    cfg = load_config(DEMO, work_dir=osp.join(work_dir, 'eval'), cfg_options=opts)
    cfg.test_dataloader.dataset.pipeline[1].scale = (size, size)
    cfg.load_from = osp.join(work_dir, f'epoch_{epochs}.pth')
    runner = build_runner(cfg)
    runner.load_or_resume()
    if not record:
        for m in runner.model.modules():
            if isinstance(m, TrainedOffsetRange):
                m.reset()
    metrics = runner.test()
    return metrics['coco/bbox_mAP'], metrics['coco/bbox_mAP_50']


def branch_scales(work_dir, data_root, seed, backbone, epochs):
    """RMS of GSA's content and positional branches, per stage, on val_2x / val images."""
    cfg = load_config(DEMO, cfg_options=options(data_root, seed, backbone, epochs))
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model)
    load_checkpoint(model, osp.join(work_dir, f'epoch_{epochs}.pth'), map_location='cpu', logger='silent')
    model.eval()
    rms = {}

    def hook(name):
        def fn(module, args, _):
            x = args[0]
            q, k, v = module.qkv_heads(x)
            B, _, H, W = x.shape
            pos = column_attention(q, v, module.relative_table('column', H)) / (H if module.axial_mean else 1)
            pos = module.norm_col(pos.reshape(B, -1, H, W)).reshape(pos.shape)
            pos = row_attention(q, pos, module.relative_table('row', W)) / (W if module.axial_mean else 1)
            stage = name.split('.')[1]
            for branch, t in (('content', content_attention(q, k, v)), ('positional', pos)):
                rms.setdefault((stage, branch), []).append(float(t.square().mean().sqrt()))
        return fn

    for name, m in model.backbone.named_modules():
        if isinstance(m, GlobalSelfAttention2d):
            m.register_forward_hook(hook(name))
    out = {}
    for split, size in (('val', 128), ('val_2x', 256)):
        rms.clear()
        images = []
        for i in range(8):
            img = np.asarray(Image.open(osp.join(data_root, split, f'{i:06d}.png')), dtype=np.float32)
            images.append(torch.from_numpy(img).permute(2, 0, 1))
        x = model.data_preprocessor(dict(inputs=images), training=False)['inputs']
        with torch.no_grad():
            model.backbone(x)
        out[size] = {key: statistics.mean(v) for key, v in rms.items()}
    return {key: out[256][key] / out[128][key] for key in out[128]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--backbones', nargs='+', default=list(BACKBONES))
    parser.add_argument('--epochs', type=int, default=12, help='the recipe\'s 12; the LR steps scale with it')
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data/shapes'))
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs/position_extrapolation'))
    args = parser.parse_args()
    data_root = args.data_root.rstrip('/') + '/'
    generate_shapes_coco(data_root)
    # 256 px images, objects as large as in the 128 px training images, 4x the objects per image
    generate_shapes_split(data_root, 'val_2x', 100, image_size=256, object_scale=128, max_objects=16)
    cols = [('val', 128, True), ('val_2x', 256, True), ('val_2x', 256, False)]
    table = {}
    for backbone in args.backbones:
        for seed in args.seeds:
            work_dir = osp.join(args.work_dir, f'{backbone}_seed{seed}')
            if not osp.isfile(osp.join(work_dir, f'epoch_{args.epochs}.pth')):
                cfg = load_config(DEMO, work_dir=work_dir, cfg_options=options(data_root, seed, backbone, args.epochs))
                build_runner(cfg).train()
            row = [evaluate(data_root, work_dir, seed, backbone, args.epochs, *c) for c in cols]
            table.setdefault(backbone, []).append(row)
            print(f'RESULT {backbone} seed {seed}: ' + '  '.join(
                f'{s}@{z} {"record" if r else "whole table"}: mAP {m:.3f} mAP_50 {m50:.3f}'
                for (s, z, r), (m, m50) in zip(cols, row)), flush=True)
    print('\nmean (spread) of mAP over seeds; paired difference record - whole table at 2x')
    for backbone, rows in table.items():
        means = [statistics.mean(r[i][0] for r in rows) for i in range(len(cols))]
        spreads = [max(r[i][0] for r in rows) - min(r[i][0] for r in rows) for i in range(len(cols))]
        diffs = [r[1][0] - r[2][0] for r in rows]
        print(f'{backbone:18s} ' + '  '.join(f'{m:.3f} ({s:.3f})' for m, s in zip(means, spreads))
              + f'   diff {statistics.mean(diffs):+.3f} [{min(diffs):+.3f}, {max(diffs):+.3f}]')
    scales = {}
    for backbone in [b for b in args.backbones if b.startswith('GSA')]:
        print(f'\n{backbone} branch RMS at 256 px / at 128 px (8 images, mean over the stage\'s modules):')
        for seed in args.seeds:
            work_dir = osp.join(args.work_dir, f'{backbone}_seed{seed}')
            scales[f'{backbone} seed {seed}'] = scale = branch_scales(work_dir, data_root, seed, backbone, args.epochs)
            print(f'seed {seed}: ' + '  '.join(f'{stage} {branch} {r:.2f}' for (stage, branch), r in sorted(scale.items())))
    with open(osp.join(args.work_dir, 'results.json'), 'w') as f:
        json.dump({'columns': cols, 'rows': table,
                   'gsa_scale': {s: {f'{k[0]} {k[1]}': v for k, v in d.items()} for s, d in scales.items()}}, f)


if __name__ == '__main__':
    main()
