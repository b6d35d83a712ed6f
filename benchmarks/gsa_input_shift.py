"""Backbone outputs off their training conditions: input size and input scale
(contrast).

ResNet-50, AA-ResNet-50 and GSA-ResNet-50 (narrow: ``base_channels=16``, 2
heads; GSA with each ``attention.axial_scale``: ``'trained'``, the default,
``'sum'`` and ``'mean'``), each with ``zero_init_residual=False`` so every
residual branch is live, as after training. BatchNorm statistics are fixed at
the training size: a few training-mode forward passes on N(0, 1) inputs at
``--train-size`` with a cumulative average (``momentum=None``), then evaluation
mode. Every model is then evaluated on N(0, 1) inputs

* at the training size (the reference),
* at 1.5x and 2x the training size (the same statistics, longer feature maps),
* at the training size with the input multiplied by 1.5 and 2 (contrast),

and the table gives max |output| of each stage (``inf`` / ``nan`` where it is
not finite) and, per shift, the largest ratio to the reference over the stages.

``--train-steps N`` instead trains the GSA models (as GSA-ResNet-26,
``base_channels=8``, the test's size) N SGD steps (lr 0.02, momentum 0.9,
mmdet's default ``zero_init_residual=True``) on a small classification task at
the training size and keeps the running statistics training left, as a user's
short run would (the test ``tests/test_gsa_input_shift.py`` does the same
through the registry).

    .venv/bin/python benchmarks/gsa_input_shift.py [--train-size 64]
    .venv/bin/python benchmarks/gsa_input_shift.py --train-size 32 \\
        --train-steps 40
"""
import argparse
import logging
import math
import os.path as osp
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools', 'env'))
from env_check import require_env  # noqa: E402

require_env()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from mmengine.logging import MMLogger  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

import aa_det  # noqa: E402,F401  (registers the backbones)

COMMON = dict(depth=50, base_channels=16, norm_eval=False)
MODELS_CFG = {
    'ResNet-50':
    dict(type='ResNet'),
    'AA-ResNet-50':
    dict(type='AAResNet', attention=dict(num_heads=2, min_key_dim_per_head=4)),
    'GSA-ResNet-50':
    dict(type='GSAResNet', attention=dict(num_heads=2)),
    'GSA-ResNet-50 sum':
    dict(type='GSAResNet', attention=dict(num_heads=2, axial_scale='sum')),
    'GSA-ResNet-50 mean':
    dict(type='GSAResNet', attention=dict(num_heads=2, axial_scale='mean')),
}


def shapes_task(batch: int, size: int):
    """N(0, 0.25) noise with a bright square in one of four quadrants; the
    label is the quadrant."""
    x = torch.randn(batch, 3, size, size) * 0.5
    y = torch.randint(0, 4, (batch, ))
    for i, label in enumerate(y.tolist()):
        r, c = divmod(label, 2)
        x[i, :, r * size // 2:r * size // 2 + size // 4,
          c * size // 2:c * size // 2 + size // 4] += 2
    return x, y


def short_train(model, steps: int, size: int):
    """``steps`` SGD steps (lr 0.02, momentum 0.9) of a linear classifier on
    the last stage."""
    head = torch.nn.Linear(model.feat_dim, 4)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()],
                          lr=0.02,
                          momentum=0.9,
                          weight_decay=1e-4)
    model.train()
    for _ in range(steps):
        x, y = shapes_task(8, size)
        loss = F.cross_entropy(head(model(x)[-1].mean((2, 3))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def fix_statistics(model, size: int, passes: int = 4):
    """BatchNorm statistics as the average over ``passes`` training-mode
    batches at ``size``."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(passes):
            model(torch.randn(4, 3, size, size))


def stage_max(model, size: int, contrast: float):
    """max |output| per stage on a fixed N(0, 1) batch of ``size``, times
    ``contrast``."""
    gen = torch.Generator().manual_seed(size)
    x = torch.randn(2, 3, size, size, generator=gen) * contrast
    with torch.no_grad():
        return [
            o.abs().max().item() if o.isfinite().all() else
            float('nan' if o.isnan().any() else 'inf') for o in model(x)
        ]


def fmt(v: float) -> str:
    return f'{v:9.3g}' if math.isfinite(v) else f'{v!s:>9}'


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--train-size', type=int, default=64)
    parser.add_argument(
        '--train-steps',
        type=int,
        default=0,
        help='SGD steps of the GSA models before the measurement; 0: BN '
        'statistics only')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    init_default_scope('mmdet')
    s = args.train_size
    shifts = [('reference', s, 1.0), ('size 1.5x', s * 3 // 2, 1.0),
              ('size 2x', 2 * s, 1.0), ('contrast 1.5x', s, 1.5),
              ('contrast 2x', s, 2.0)]
    names = [
        n for n in MODELS_CFG if args.train_steps == 0 or n.startswith('GSA')
    ]
    statistics = (
        f'{args.train_steps} SGD steps at {s}x{s}, their running statistics'
        if args.train_steps else
        f'BN statistics from 4 training-mode batches at {s}x{s}')
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads; '
          f'{statistics}; eval mode; max |output| of stages 1-4; growth = '
          f'largest ratio to the reference over the stages')
    print(f'{"model":25s} {"input":14s} {"stage 1":>9s} {"stage 2":>9s} '
          f'{"stage 3":>9s} {"stage 4":>9s} {"growth":>9s}')
    start = time.time()
    for name in names:
        torch.manual_seed(args.seed)
        cfg = dict(
            COMMON,
            **MODELS_CFG[name],
            zero_init_residual=args.train_steps > 0)
        if args.train_steps:
            cfg.update(depth=26, base_channels=8)
        model = MODELS.build(cfg)
        model.init_weights()
        if args.train_steps:
            short_train(model, args.train_steps, s)
        else:
            fix_statistics(model, s)
        model.eval()
        shown = name.replace('-50', '-26') if args.train_steps else name
        ref = None
        for label, size, contrast in shifts:
            out = stage_max(model, size, contrast)
            ref = ref or out
            finite = all(map(math.isfinite, out + ref))
            growth = max(o / r
                         for o, r in zip(out, ref)) if finite else float('inf')
            print(
                f'{shown:25s} {label + f" {size}":14s} ' +
                ' '.join(fmt(v) for v in out) + f' {fmt(growth)}',
                flush=True)
    print(f'{time.time() - start:.0f} s')


if __name__ == '__main__':
    main()
