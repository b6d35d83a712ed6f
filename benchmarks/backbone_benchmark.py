"""Backbones compared where they differ: RetinaNet trained from scratch on
shapes over real photographs.

The shapes demo saturates near mAP 0.9 for every backbone; this data does not.
It is generated offline and deterministically (:func:`generate`) in COCO
format:

* backgrounds: the photographs bundled with scikit-image (``skimage/data``),
  random crops of 1-3x the image size; training and validation images take them
  from disjoint photographs (:data:`TRAIN_PHOTOS`, :data:`VAL_PHOTOS`), so
  validation is held out;
* 10 classes (:data:`CLASSES`), upright shapes filled with a flat colour or
  with a patch of another photograph, with a dark or light outline;
* objects 12-48 px on 160 px images (a 4x range of scales); later objects may
  cover earlier ones (an object more than half covered is left unlabelled, as
  clutter); clutter: lines, open polylines and dots.

Each backbone (:data:`BACKBONES`: ResNet-18, AA-ResNet-18, GSA-ResNet-26 as its
detection configs set it (stages 3-4 attentional), GSA-ResNet-26 with stages
2-4 and with every stage attentional (the paper's default), and ResNet-26 of
GSA-ResNet-26's own shape with every stage convolutional, mmdet's Bottleneck)
trains with the demo recipe at 160 px
(``configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py`` and
its GSA twin ``retinanet_gsa-r26-scratch_fpn_1xb8-ms-12e_shapes.py``: from
scratch, jitter, flips, warm-up, clipping, one BatchNorm per FPN level in the
head; ``--epochs``, the LR steps at 3/4 and 11/12), each seed in its own
process, and is tested at the training size (``val``, 160 px) and at 2x
(``val_2x``: 320 px images, objects at the same pixel scale, so every map is
twice as long).

    # an ablation
    .venv/bin/python benchmarks/backbone_benchmark.py
        [--backbones ResNet-18 GSA-ResNet-26 ...] [--seeds 0 1 2] [--epochs 24]
        [--work-dir work_dirs/backbone_benchmark]
        [--set model.backbone.attention.components="('content',)" ...]

Prints a line per trained detector and ``mean +- spread (min-max)`` of COCO mAP
per backbone and split; merges every run into ``results.json`` in the work dir
(``results_<overrides>.json`` for an ablation), a backbone's seeds gathered
over invocations. Trained checkpoints are reused.
"""
import argparse
import json
import math
import os
import os.path as osp
import re
import statistics
import subprocess
import sys
import time

import numpy as np
from PIL import Image, ImageDraw

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path[1:1] = [osp.join(ROOT, 'tools'), osp.join(ROOT, 'demo')]
from synthetic_shapes import write_coco_split  # noqa: E402

DEMO = osp.join(
    ROOT,
    'configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py')
# the demo recipe
GSA = osp.join(
    ROOT,
    'configs/retinanet/retinanet_gsa-r26-scratch_fpn_1xb8-ms-12e_shapes.py')
CLASSES = ('circle', 'square', 'triangle', 'diamond', 'star', 'cross', 'ring',
           'hexagon', 'half_disc', 'arrow')
TRAIN_PHOTOS = ('astronaut.png', 'camera.png', 'chelsea.png', 'coffee.png',
                'coins.png', 'hubble_deep_field.jpg', 'motorcycle_left.png',
                'rocket.jpg', 'grass.png', 'brick.png', 'page.png')
VAL_PHOTOS = ('ihc.png', 'moon.png', 'motorcycle_right.png', 'retina.jpg',
              'gravel.png', 'text.png')
IMAGE = 160
#: backbone name -> (its detector config, overrides of that config); narrow
#: widths (``base_channels``)
BACKBONES = {
    'ResNet-18': (DEMO, {
        'model.backbone':
        dict(
            _delete_=True,
            type='ResNet',
            depth=18,
            base_channels=32,
            frozen_stages=-1,
            norm_eval=False,
            norm_cfg=dict(type='BN', requires_grad=True),
            init_cfg=None)
    }),
    'AA-ResNet-18': (DEMO, {}),  # the demo's own
    # GSA's detection default: stages 3-4 (GSA Table 5's 'XX' row)
    'GSA-ResNet-26': (GSA, {}),
    'GSA-ResNet-26, stages 2-4': (GSA, {
        'model.backbone.stage_with_attention': (False, True, True, True)
    }),
    'GSA-ResNet-26, all stages': (GSA, {
        'model.backbone.stage_with_attention': (True, True, True, True)
    }),
    'ResNet-26 (GSA shape)': (GSA, {
        'model.backbone.stage_with_attention': (False, False, False, False)
    }),
}
SPLITS = (('val', IMAGE), ('val_2x', 2 * IMAGE))


def photo_dir() -> str:
    """scikit-image's bundled photographs (installed with the ``tests``
    extra)."""
    import importlib.util
    spec = importlib.util.find_spec('skimage')
    if spec is None:
        sys.exit('backbone_benchmark.py: scikit-image is missing (bash '
                 'tools/env/setup_env.sh installs it)')
    return osp.join(osp.dirname(spec.origin), 'data')


def _shape(name: str, cx: float, cy: float, s: float) -> list:
    """Polygon points (or an ellipse box for 'circle' / 'ring' / 'half_disc')
    of class ``name``, size ``s``."""
    r = s / 2
    if name in ('circle', 'ring'):
        return [cx - r, cy - r, cx + r, cy + r]
    if name == 'half_disc':
        return [(cx + r * math.cos(a), cy - r * math.sin(a))
                for a in np.linspace(0, math.pi, 16)]
    if name == 'square':
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r),
                (cx - r, cy + r)]
    if name == 'diamond':
        return [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    if name == 'triangle':
        return [(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if name == 'hexagon':
        return [(cx + r * math.cos(a), cy + r * math.sin(a))
                for a in np.arange(6) * math.pi / 3]
    if name == 'star':
        return [
            (cx + (r if i % 2 == 0 else r / 2.5) * math.sin(i * math.pi / 5),
             cy - (r if i % 2 == 0 else r / 2.5) * math.cos(i * math.pi / 5))
            for i in range(10)
        ]
    if name == 'cross':
        t = r / 3
        return [(cx - t, cy - r), (cx + t, cy - r), (cx + t, cy - t),
                (cx + r, cy - t), (cx + r, cy + t), (cx + t, cy + t),
                (cx + t, cy + r), (cx - t, cy + r), (cx - t, cy + t),
                (cx - r, cy + t), (cx - r, cy - t), (cx - t, cy - t)]
    if name == 'arrow':
        t = r / 3
        return [(cx - r, cy - t), (cx, cy - t), (cx, cy - r), (cx + r, cy),
                (cx, cy + r), (cx, cy + t), (cx - r, cy + t)]
    raise ValueError(name)


def _draw(draw: ImageDraw.ImageDraw, name: str, points, fill, outline):
    if name in ('circle', 'ring'):
        draw.ellipse(points, fill=fill, outline=outline, width=2)
        if name == 'ring':
            x0, y0, x1, y1 = points
            d = (x1 - x0) * 0.3
            draw.ellipse([x0 + d, y0 + d, x1 - d, y1 - d],
                         fill=0 if fill == 255 else None,
                         outline=outline,
                         width=2)
    else:
        draw.polygon(points, fill=fill, outline=outline, width=2)


def _background(photos, rng, size):
    photo = photos[rng.integers(len(photos))]
    crop = int(min(photo.size) / rng.uniform(1.0, 3.0))
    x, y = rng.integers(photo.width - crop + 1), rng.integers(photo.height -
                                                              crop + 1)
    return photo.crop((x, y, x + crop, y + crop)).resize((size, size),
                                                         Image.BILINEAR)


def render(photos, rng, size, max_objects):
    """One image and its annotations ``(class index, [x, y, w, h])``."""
    image = _background(photos, rng, size)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.integers(3, 9)):  # clutter: lines, open polylines, dots
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        points = [
            tuple(p) for p in rng.uniform(0, size, (rng.integers(2, 5), 2))
        ]
        if rng.random() < 0.2:
            x, y = points[0]
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
        else:
            draw.line(points, fill=colour, width=int(rng.integers(1, 4)))
    # which object each pixel shows
    owner = np.full((size, size), -1, np.int32)
    objects = []
    for index in range(rng.integers(2, max_objects + 1)):
        label = int(rng.integers(len(CLASSES)))
        s = float(rng.uniform(12, 48))
        cx, cy = rng.uniform(s / 2, size - s / 2, 2)
        points = _shape(CLASSES[label], cx, cy, s)
        mask = Image.new('L', (size, size), 0)
        _draw(ImageDraw.Draw(mask), CLASSES[label], points, 255, 255)
        mask_np = np.asarray(mask) > 0
        outline = (20, 20, 20) if rng.random() < 0.5 else (235, 235, 235)
        if rng.random() < 0.5:  # a flat colour
            fill = Image.new('RGB', (size, size),
                             tuple(int(c) for c in rng.integers(0, 256, 3)))
        else:  # a patch of another photograph
            fill = _background(photos, rng, size)
        image.paste(fill, (0, 0), mask)
        _draw(draw, CLASSES[label], points, None, outline)
        owner[mask_np] = index
        ys, xs = np.nonzero(mask_np)
        objects.append((label, mask_np.sum(), [
            float(xs.min()),
            float(ys.min()),
            float(xs.max() - xs.min() + 1),
            float(ys.max() - ys.min() + 1)
        ]))
    annotations = [
        (label, box) for index, (label, area, box) in enumerate(objects)
        # more than half covered: clutter
        if (owner == index).sum() >= 0.5 * area
    ]
    return image, annotations


def generate(root: str,
             split: str,
             num: int,
             seed: int,
             size: int = IMAGE,
             max_objects: int = 6) -> str:
    """Write ``root/split/*.png`` and
    ``root/annotations/instances_<split>.json`` (skipped when present)."""
    ann_file = osp.join(root, 'annotations', f'instances_{split}.json')
    if osp.isfile(ann_file):
        return ann_file
    names = TRAIN_PHOTOS if split == 'train' else VAL_PHOTOS
    photos = [
        Image.open(osp.join(photo_dir(), n)).convert('RGB') for n in names
    ]
    rng = np.random.default_rng(seed)
    return write_coco_split(
        root, split,
        (render(photos, rng, size, max_objects) for _ in range(num)), CLASSES,
        dict(description='aa_det shapes over photographs', seed=seed))


def options(data_root: str, seed: int, epochs: int, backbone: str,
            extra: dict) -> dict:
    """The demo config's overrides: the data, 10 classes, 160 px, the schedule,
    the backbone, then ``extra``."""
    opts = {
        f'{s}_dataloader.dataset.data_root': data_root
        for s in ('train', 'val', 'test')
    }
    opts.update({
        f'{s}_dataloader.dataset.metainfo.classes': CLASSES
        for s in ('train', 'val', 'test')
    })
    opts.update({
        f'{s}_evaluator.ann_file': data_root + 'annotations/instances_val.json'
        for s in ('val', 'test')
    })
    opts.update({
        'model.bbox_head.num_classes':
        len(CLASSES),
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
        'param_scheduler.1.milestones': [epochs * 3 // 4, epochs * 11 // 12],
        'train_dataloader.dataset.pipeline.2.scale': (IMAGE, IMAGE),
        'train_dataloader.dataset.pipeline.3.crop_size': (IMAGE, IMAGE)
    })
    opts.update(BACKBONES[backbone][1])
    # after the backbone's: an ablation's key inside a dict the backbone sets
    opts.update(extra)
    return opts


def run_one(backbone: str, seed: int, epochs: int, data_root: str,
            work_dir: str, extra: dict) -> dict:
    """Train (or reuse) one detector and test it on every split:
    ``{split: mAP}``."""
    # isort: off
    from aa_det.engine import NonFiniteOutputError
    from config_runner import build_runner, load_config
    # isort: on
    opts = options(data_root, seed, epochs, backbone, extra)
    checkpoint = osp.join(work_dir, f'epoch_{epochs}.pth')
    if not osp.isfile(checkpoint):
        start = time.time()
        build_runner(
            load_config(
                BACKBONES[backbone][0], work_dir=work_dir,
                cfg_options=opts)).train()
        print(
            f'TRAINED {backbone} seed {seed} in {time.time() - start:.0f} s',
            flush=True)
    result = {}
    for split, size in SPLITS:
        split_opts = dict(
            opts, **{
                'test_dataloader.dataset.ann_file':
                f'annotations/instances_{split}.json',
                'test_dataloader.dataset.data_prefix.img': f'{split}/',
                'test_evaluator.ann_file':
                data_root + f'annotations/instances_{split}.json',
                'test_dataloader.dataset.pipeline.1.scale': (size, size)
            })
        cfg = load_config(
            BACKBONES[backbone][0],
            work_dir=osp.join(work_dir, 'test'),
            cfg_options=split_opts)
        cfg.load_from = checkpoint
        try:
            # no box above the score threshold: CocoMetric returns no figure,
            # mAP 0
            result[split] = build_runner(
                cfg, splits=('test', )).test().get('coco/bbox_mAP', 0.0)
        except NonFiniteOutputError:
            result[split] = math.nan
    return result


def run_name(backbone: str) -> str:
    """The work-dir name of ``backbone``'s runs: 'GSA-ResNet-26, all stages' ->
    'GSA-ResNet-26_all_stages'."""
    return re.sub(r'[^A-Za-z0-9-]+', '_', backbone).strip('_')


def summary(values) -> str:
    if len(values) == 1:
        return f'{values[0]:.3f}'
    return (f'{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f} '
            f'({min(values):.3f}-{max(values):.3f})')


def _parse_set(items):
    extra = {}
    for item in items or ():
        key, value = item.split('=', 1)
        try:
            # a literal: numbers, tuples, strings, True / False
            extra[key] = eval(value, {})
        except Exception:
            extra[key] = value
    return extra


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--backbones',
        nargs='+',
        default=list(BACKBONES),
        choices=list(BACKBONES))
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--epochs', type=int, default=24)
    parser.add_argument('--num-train', type=int, default=640)
    parser.add_argument('--num-val', type=int, default=200)
    parser.add_argument(
        '--data-root', default=osp.join(ROOT, 'data/photo_shapes'))
    parser.add_argument(
        '--work-dir', default=osp.join(ROOT, 'work_dirs/backbone_benchmark'))
    parser.add_argument(
        '--set',
        nargs='+',
        metavar='KEY=VALUE',
        help='config overrides for every run (ablations)')
    parser.add_argument(
        '--one', nargs=2, metavar=('BACKBONE', 'SEED'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    data_root = args.data_root.rstrip('/') + '/'
    extra = _parse_set(args.set)
    tag = '_'.join(f'{k.split(".")[-1]}-{v}'
                   for k, v in extra.items()).replace(' ',
                                                      '').replace("'", '')
    if args.one:
        backbone, seed = args.one[0], int(args.one[1])
        work_dir = osp.join(
            args.work_dir,
            f'{run_name(backbone)}{"_" + tag if tag else ""}_seed{seed}')
        print(
            'RESULT ' + json.dumps(
                run_one(backbone, seed, args.epochs, data_root, work_dir,
                        extra)),
            flush=True)
        return
    generate(data_root, 'train', args.num_train, seed=1)
    generate(data_root, 'val', args.num_val, seed=2)
    generate(
        data_root,
        'val_2x',
        args.num_val,
        seed=3,
        size=2 * IMAGE,
        max_objects=24)
    table = {}
    for backbone in args.backbones:
        for seed in args.seeds:
            cmd = [
                sys.executable, __file__, '--one', backbone,
                str(seed), '--epochs',
                str(args.epochs), '--data-root', data_root, '--work-dir',
                args.work_dir
            ] + (['--set', *args.set] if args.set else [])
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            lines = [
                line for line in out.stdout.splitlines()
                if line.startswith(('RESULT', 'TRAINED'))
            ]
            if out.returncode != 0 or not lines or not lines[-1].startswith(
                    'RESULT'):
                print(
                    f'{backbone} seed {seed} failed: '
                    f'{out.stderr.strip().splitlines()[-1:]}',
                    flush=True)
                continue
            result = json.loads(lines[-1][len('RESULT '):])
            table.setdefault(backbone, []).append(dict(result, seed=seed))
            print(
                f'{backbone} seed {seed}: ' +
                '  '.join(f'{k} {v:.3f}' for k, v in result.items()) +
                ('  (' + lines[0] +
                 ')' if lines[0].startswith('TRAINED') else ''),
                flush=True)
    print(f'\nCOCO bbox mAP{" with " + str(extra) if extra else ""}, '
          f'{args.epochs} epochs, seeds {args.seeds}: mean +- standard '
          f'deviation (min-max)')
    print('| backbone | ' + ' | '.join(f'{split} ({size} px)'
                                       for split, size in SPLITS) + ' |')
    print('|---' * (len(SPLITS) + 1) + '|')
    for backbone, rows in table.items():
        print(f'| {backbone} | ' +
              ' | '.join(summary([r[s] for r in rows])
                         for s, _ in SPLITS) + ' |')
    os.makedirs(args.work_dir, exist_ok=True)
    write_results(
        osp.join(args.work_dir, f'results{"_" + tag if tag else ""}.json'),
        args.epochs, extra, table)


def write_results(path: str, epochs: int, overrides: dict, table: dict):
    """Merge ``table`` (``{backbone: [{split: mAP, 'seed': s}]}``) into the
    results file at ``path``: a run of the same backbone and seed replaces the
    file's, other runs stay (one file over several invocations)."""
    results = {}
    if osp.isfile(path):
        with open(path) as f:
            previous = json.load(f)
        if previous.get('epochs') == epochs and previous.get(
                'overrides', {}) == json.loads(json.dumps(overrides)):
            results = {
                b: [r for r in rows if 'seed' in r]
                for b, rows in previous['results'].items()
            }
    for backbone, rows in table.items():
        by_seed = {r['seed']: r for r in results.get(backbone, []) + rows}
        results[backbone] = [by_seed[s] for s in sorted(by_seed)]
    with open(path, 'w') as f:
        json.dump(
            dict(epochs=epochs, overrides=overrides, results=results),
            f,
            indent=1)


if __name__ == '__main__':
    main()
