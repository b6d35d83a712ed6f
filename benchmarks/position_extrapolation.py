"""GSA-ResNet detectors tested above their training size: which axial scaling
to default to.

The demo recipe (RetinaNet + FPN from scratch on the generated shapes, 128 px
crops with multiscale jitter, 12 epochs) with a narrow GSA-ResNet-26
attentional in every stage (the paper's default, so that the longest maps,
stage 1's, run the axial sums), trained with several seeds in two forms of the
axial sums (``attention.axial_scale``):

* ``sum``: the paper's eq. (7) sums. The same checkpoint is also evaluated as
  ``trained`` (the sums up to the longest trained axis, rescaled by ``T / L``
  beyond it): both forms train identically (a learning pass always covers its
  own map), so only the evaluation differs.
* ``mean``: sums divided by the axis length, in training too.

Every trained detector is evaluated on

* ``val``: 128 px images (the training size);
* ``val_2x`` / ``val_4x``: 256 / 512 px images with objects at the training
  images' scale, so every feature map is 2x / 4x as long;
* ``val@1333x800``: the 128 px images resized to mmdet's default test scale (to
  800x800, objects 6.25x as large).

A non-finite evaluation (``StopOnNonFiniteOutputs`` stops it) is reported as
``nan``.

    .venv/bin/python benchmarks/position_extrapolation.py [--seeds 0 1 2]
        [--forms sum mean] [--epochs 12] [--work-dir DIR]

Prints one line per (form, seed) and the mean (min - max) of the COCO mAP per
column; writes ``results.json`` to the work dir. Trained checkpoints are reused
when present.
"""
import argparse
import json
import math
import os.path as osp
import statistics
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path[1:1] = [
    osp.join(ROOT, 'tools'),
    osp.join(ROOT, 'tools', 'env'),
    osp.join(ROOT, 'demo')
]
from env_check import require_env  # noqa: E402

require_env()

from config_runner import build_runner, load_config  # noqa: E402
from synthetic_shapes import generate_shapes_coco  # noqa: E402
from synthetic_shapes import generate_shapes_split  # noqa: E402

from aa_det.engine import NonFiniteOutputError  # noqa: E402

CONFIG = osp.join(
    ROOT,
    'configs/retinanet/retinanet_gsa-r26-scratch_fpn_1xb8-ms-12e_shapes.py')
#: trained form -> the forms its checkpoint is evaluated in
EVALUATED = {'sum': ('sum', 'trained'), 'mean': ('mean', )}
#: (split, test scale): the training size, 2x and 4x maps at the same object
#: scale, mmdet's default
COLUMNS = (('val', (128, 128)), ('val_2x', (256, 256)), ('val_4x', (512, 512)),
           ('val', (1333, 800)))


def options(data_root, seed, form, epochs):
    opts = {
        f'{s}_dataloader.dataset.data_root': data_root
        for s in ('train', 'val', 'test')
    }
    opts.update({
        f'{s}_evaluator.ann_file': data_root + 'annotations/instances_val.json'
        for s in ('val', 'test')
    })
    opts.update({
        'randomness.seed':
        seed,
        'train_cfg.val_interval':
        10**6,
        'train_cfg.max_epochs':
        epochs,
        'default_hooks.checkpoint.interval':
        epochs,
        'param_scheduler.1.end':
        epochs,
        'param_scheduler.1.milestones': [epochs * 3 // 4, epochs * 11 // 12]
    })
    opts['model.backbone.attention.axial_scale'] = form
    # stage 1's 32-128 px maps too
    opts['model.backbone.stage_with_attention'] = (True, True, True, True)
    return opts


def evaluate(data_root, work_dir, seed, trained_form, form, epochs, split,
             scale):
    """COCO bbox mAP of the final checkpoint on ``split`` resized to ``scale``,
    with the axial sums in ``form``; nan when the outputs are not finite."""
    opts = options(data_root, seed, form, epochs)
    opts.update({
        'test_dataloader.dataset.ann_file':
        f'annotations/instances_{split}.json',
        'test_dataloader.dataset.data_prefix.img':
        f'{split}/',
        'test_evaluator.ann_file':
        data_root + f'annotations/instances_{split}.json'
    })
    cfg = load_config(
        CONFIG, work_dir=osp.join(work_dir, 'eval'), cfg_options=opts)
    cfg.test_dataloader.dataset.pipeline[1].scale = scale
    cfg.load_from = osp.join(work_dir, f'epoch_{epochs}.pth')
    runner = build_runner(cfg, splits=('test', ))
    try:
        return runner.test()['coco/bbox_mAP']
    except NonFiniteOutputError as e:
        print(
            f'NONFINITE {trained_form} seed {seed} as {form} on '
            f'{split}@{scale}: {e}',
            flush=True)
        return math.nan


def summary(values):
    finite = [v for v in values if not math.isnan(v)]
    if len(finite) < len(values):
        return f'nan ({len(values) - len(finite)} of {len(values)})'
    return (f'{statistics.mean(values):.3f} '
            f'({min(values):.3f}-{max(values):.3f})')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument(
        '--forms',
        nargs='+',
        default=list(EVALUATED),
        choices=list(EVALUATED),
        help='trained forms (sum is evaluated as sum and as trained)')
    parser.add_argument(
        '--epochs',
        type=int,
        default=12,
        help='the recipe\'s 12; the LR steps scale with it')
    parser.add_argument(
        '--num-val', type=int, default=100, help='images per validation split')
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data/shapes'))
    parser.add_argument(
        '--work-dir',
        default=osp.join(ROOT, 'work_dirs/position_extrapolation'))
    args = parser.parse_args()
    data_root = args.data_root.rstrip('/') + '/'
    generate_shapes_coco(data_root, num_val=args.num_val)
    # 4 objects tried per 128x128 area
    for split, factor in (('val_2x', 2), ('val_4x', 4)):
        generate_shapes_split(
            data_root,
            split,
            args.num_val,
            image_size=128 * factor,
            object_scale=128,
            max_objects=4 * factor**2)
    table = {}
    for trained_form in args.forms:
        for seed in args.seeds:
            work_dir = osp.join(args.work_dir,
                                f'gsa-r26_{trained_form}_seed{seed}')
            if not osp.isfile(osp.join(work_dir, f'epoch_{args.epochs}.pth')):
                start = time.time()
                cfg = load_config(
                    CONFIG,
                    work_dir=work_dir,
                    cfg_options=options(data_root, seed, trained_form,
                                        args.epochs))
                build_runner(cfg).train()
                print(
                    f'TRAINED {trained_form} seed {seed} in '
                    f'{time.time() - start:.0f} s',
                    flush=True)
            for form in EVALUATED[trained_form]:
                row = [
                    evaluate(data_root, work_dir, seed, trained_form, form,
                             args.epochs, split, scale)
                    for split, scale in COLUMNS
                ]
                table.setdefault(form, []).append(row)
                print(
                    f'RESULT {form} (trained as {trained_form}) seed {seed}: '
                    + '  '.join(f'{split}@{scale[0]}x{scale[1]} {m:.3f}'
                                for (split, scale), m in zip(COLUMNS, row)),
                    flush=True)
    print('\nCOCO bbox mAP, mean (min-max) over seeds; nan (k of n): k '
          'evaluations non-finite')
    print('| axial_scale | ' + ' | '.join(f'{split} @ {scale[0]}x{scale[1]}'
                                          for split, scale in COLUMNS) + ' |')
    print('|---' * (len(COLUMNS) + 1) + '|')
    for form, rows in table.items():
        print(f'| `{form}` | ' + ' | '.join(
            summary([r[i] for r in rows]) for i in range(len(COLUMNS))) + ' |')
    with open(osp.join(args.work_dir, 'results.json'), 'w') as f:
        json.dump({'columns': COLUMNS, 'seeds': args.seeds, 'rows': table}, f)


if __name__ == '__main__':
    main()
