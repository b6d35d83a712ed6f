"""Where GSA-ResNet-50's forward FLOPs exceed ResNet-50's, and the floor of an
exact GSA.

Both backbones' forward pass at batch 1
(``torch.utils.flop_counter.FlopCounterMode``, per module), the 3x3 layer of
every block side by side: ResNet-50's ``conv2`` against the GSA module that
replaces it (``layerN.i.conv2``); every other layer is identical.

The paper's stride-2 GSA modules (first block of stages 2-4, GSA Sec. 4) run at
their input's resolution and are then average-pooled 2x2. ``floor`` is what an
exact stride-aware module could save there, the module's output being linear in
each of its branches' final products:

* row attention's value product ``sum_n A[i, j, n] v[i, n]``: summing the
  logits of each pair of columns ``j`` before it halves that GEMM
  (``B * H * W/2 * W * C`` multiply-adds);
* content attention's product with ``q`` at the pooled positions only (``q``
  pooled first): three quarters of ``B * HW * C * dkh``.

Nothing else can move: the qkv projection, content attention's context, column
attention (its output feeds the BatchNorm's statistics and every row) and the
row logits are needed at every position. ``floor`` = GSA's FLOPs less those
savings, against ResNet-50's.

    .venv/bin/python benchmarks/gsa_flops.py            # 640x640
    .venv/bin/python benchmarks/gsa_flops.py --size 1024
"""
import argparse
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools', 'env'))
from env_check import require_env  # noqa: E402

require_env()
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from mmdet.registry import MODELS  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import aa_det  # noqa: E402,F401  (registers GSAResNet)
from aa_det.models.layers import GlobalSelfAttention2d  # noqa: E402


def layer_flops(cfg: dict, size: int):
    """Total forward FLOPs, those of each block's ``conv2``, the GSA modules'
    input shapes and the model's modules by name."""
    model = MODELS.build(cfg)
    model.eval()  # mmdet's ResNet.train() returns None: no chaining
    shapes = {}
    hooks = [
        module.register_forward_hook(lambda m, args, out, name=name: shapes.
                                     __setitem__(name, args[0].shape))
        for name, module in model.named_modules()
        if isinstance(module, GlobalSelfAttention2d)
    ]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, size, size))
    for hook in hooks:
        hook.remove()
    per_module = {
        name.split('.', 1)[1]: sum(counts.values())
        for name, counts in counter.get_flop_counts().items()
        if name.endswith('.conv2')
    }
    return counter.get_total_flops(), per_module, shapes, dict(
        model.named_modules())


def stride_aware_savings(module: GlobalSelfAttention2d, shape) -> int:
    """FLOPs an exact stride-aware ``module`` would not compute (module
    docstring)."""
    if module.stride != 2:
        return 0
    B, _, H, W = shape
    C, dk = module.out_channels, module.head_dim
    row_values = B * H * (W // 2) * W * C if 'row' in module.components else 0
    # the pool's ceil_mode: odd sizes keep their last row / column
    pooled = -(-H // 2) * -(-W // 2)
    content = B * (H * W -
                   pooled) * C * dk if 'content' in module.components else 0
    # multiply-adds -> FLOPs, as FlopCounterMode counts
    return 2 * (row_values + content)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--size', type=int, default=640)
    args = parser.parse_args()
    base, base_layers, _, _ = layer_flops(
        dict(type='ResNet', depth=50), args.size)
    gsa, gsa_layers, shapes, modules = layer_flops(
        dict(type='GSAResNet', depth=50), args.size)
    print(f'forward FLOPs at 1x3x{args.size}x{args.size}, GFLOP per 3x3 layer '
          f'(ResNet-50 conv2 vs GSA module)')
    print(f'{"layer":<16} {"input":>9} {"ResNet-50":>10} {"GSA":>8} '
          f'{"difference":>11}')
    for name, flops in gsa_layers.items():
        H, W = shapes[name][-2:]
        print(
            f'{name:<16} {f"{H}x{W}":>9} {base_layers[name] / 1e9:>10.3f} '
            f'{flops / 1e9:>8.3f} {(flops - base_layers[name]) / 1e9:>+11.3f}')
    savings = sum(
        stride_aware_savings(modules[name], shape)
        for name, shape in shapes.items())
    print(f'whole backbone: ResNet-50 {base / 1e9:.3f}, GSA-ResNet-50 '
          f'{gsa / 1e9:.3f} GFLOP ({gsa / base:.4f}x)')
    print(f'floor of an exact stride-aware GSA: -{savings / 1e9:.3f} GFLOP -> '
          f'{(gsa - savings) / 1e9:.3f} ({(gsa - savings) / base:.4f}x)')


if __name__ == '__main__':
    main()
