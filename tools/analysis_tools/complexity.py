"""Parameters and GFLOPs of the backbones, next to the papers' figures.

Counts are for the classification network (trunk + global pool + fc: 1000-way
at 224x224, 100-way at 32x32 for the CIFAR Wide-ResNets), the way the papers
and torchvision count ResNet-50 (25.56M). FLOPs are counted by torch's
FlopCounterMode on the real forward pass (2 per multiply-add, which is how both
papers' "GFLOPs" read: ResNet-50 = 8.2), so the attention matmuls are included;
softmax is added at 5 FLOPs per element. These are our kernels' FLOPs: GSA's
axial kernel computes exactly the L offsets each query uses (GSA-ResNet-50:
7.18 against the paper's 7.2).

    .venv/bin/python tools/analysis_tools/complexity.py
"""
import os.path as osp
import sys

sys.path.insert(
    0, osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'env'))
from env_check import require_env  # noqa: E402

require_env()

import torch  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import aa_det  # noqa: E402,F401

# (label, backbone config, paper params (M), paper GFLOPs, source)
MODELS_TO_COUNT = [
    ('ResNet-50', dict(type='ResNet', depth=50), 25.6, 8.2, 'AA T2'),
    ('AA-ResNet-34', dict(type='AAResNet', depth=34), 20.7, 7.1, 'AA T2'),
    ('AA-ResNet-50', dict(type='AAResNet', depth=50), 25.8, 8.3, 'AA T2'),
    ('AA-ResNet-101', dict(type='AAResNet', depth=101), 45.4, 16.1, 'AA T2'),
    ('AA-ResNet-152', dict(type='AAResNet', depth=152), 61.6, 23.8, 'AA T2'),
    ('AA-ResNet-50 k=v=0.25',
     dict(
         type='AAResNet',
         depth=50,
         attention=dict(key_ratio=0.25,
                        value_ratio=0.25)), 24.3, 7.9, 'AA T5'),
    ('AA-ResNet-50 k=v=0.5',
     dict(
         type='AAResNet',
         depth=50,
         attention=dict(key_ratio=0.5, value_ratio=0.5)), 22.3, 7.3, 'AA T5'),
    ('AA-ResNet-50 k=v=0.75',
     dict(
         type='AAResNet',
         depth=50,
         attention=dict(key_ratio=0.75,
                        value_ratio=0.75)), 20.7, 6.8, 'AA T5'),
    ('AA-ResNet-50 k=v=1.0',
     dict(
         type='AAResNet',
         depth=50,
         attention=dict(key_ratio=1.0, value_ratio=1.0)), 19.4, 6.3, 'AA T5'),
    ('GSA-ResNet-38', dict(type='GSAResNet', depth=38), 14.2, 5.9, 'GSA T6'),
    ('GSA-ResNet-50', dict(type='GSAResNet', depth=50), 18.1, 7.2, 'GSA T6'),
    ('GSA-ResNet-101', dict(type='GSAResNet',
                            depth=101), 30.4, 12.2, 'GSA T6'),
    # CIFAR-100 at 32x32 with a 100-way fc
    ('Wide-ResNet-28-10', dict(type='WideResNet', depth=28,
                               widen_factor=10), 36.3, 10.4, 'AA T1'),
    ('AA-Wide-ResNet-28-10',
     dict(
         type='WideResNet',
         depth=28,
         widen_factor=10,
         attention=dict(
             key_ratio=0.2,
             value_ratio=0.1,
             num_heads=8,
             min_key_dim_per_head=20)), 36.2, 10.9, 'AA T1'),
]


def _softmax_flops(*args, out_shape=None, **kwargs):
    return 5 * int(torch.Size(out_shape).numel())


def complexity(backbone_cfg):
    """(params in M, GFLOPs) of backbone + pool + fc: 1000-way at 1x3x224x224
    (ImageNet), 100-way at 1x3x32x32 for the CIFAR Wide-ResNets."""
    backbone = MODELS.build(backbone_cfg)
    backbone.eval()  # mmdet's ResNet.train() returns None, so no chaining
    cifar = backbone_cfg['type'] == 'WideResNet'
    fc = torch.nn.Linear(backbone.feat_dim, 100 if cifar else 1000)
    params = sum(p.numel() for p in backbone.parameters()) + sum(
        p.numel() for p in fc.parameters())
    counter = FlopCounterMode(
        display=False,
        custom_mapping={torch.ops.aten._softmax: _softmax_flops})
    with counter, torch.no_grad():
        size = 32 if cifar else 224
        fc(backbone(torch.rand(1, 3, size, size))[-1].mean((2, 3)))
    return params / 1e6, counter.get_total_flops() / 1e9


def main():
    print(f'{"model":<24}{"params":>9}{"paper":>8}{"ratio":>7}{"GFLOPs":>9}'
          f'{"paper":>7}{"ratio":>7}  source')
    for label, cfg, p_paper, f_paper, source in MODELS_TO_COUNT:
        params, flops = complexity(cfg)
        print(
            f'{label:<24}{params:8.2f}M{p_paper:7.1f}M{params / p_paper:7.3f}'
            f'{flops:9.2f}{f_paper:7.1f}{flops / f_paper:7.3f}  {source}',
            flush=True)


if __name__ == '__main__':
    main()
