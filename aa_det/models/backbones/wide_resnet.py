"""Wide-ResNet for CIFAR, optionally attention augmented (AA paper Sec. 4.1,
Table 1).

Zagoruyko & Komodakis, *Wide Residual Networks* (BMVC 2016): a 3x3 stem and
three stages of pre-activation basic blocks of widths ``16k, 32k, 64k``. Bello
et al., *Attention Augmented Convolutional Networks*, ICCV 2019, augment "the
first convolution of all residual blocks" of Wide-ResNet-28-10 with relative
attention (``Nh = 8``, ``kappa = 2 upsilon = 0.2``, at least 20 key dims per
head) and no attention downsampling.

Example:
    >>> import torch
    >>> from mmdet.registry import MODELS
    >>> net = MODELS.build(
    ...     dict(type='WideResNet', depth=10, widen_factor=1,
    ...          attention=dict(num_heads=2, min_key_dim_per_head=4)))
    >>> [tuple(o.shape) for o in net(torch.rand(1, 3, 32, 32))]
    [(1, 64, 8, 8)]
"""
from typing import Optional, Sequence

import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor

from ..blocks import WideBasicBlock


@MODELS.register_module()
class WideResNet(BaseModule):
    """Wide-ResNet-``depth``-``widen_factor`` for 32x32 inputs (AA Table 1).

    Args:
        depth (int): ``6 n + 4`` layers, ``n`` blocks per stage. Defaults
            to 28.
        widen_factor (int): ``k``, stage widths ``16k, 32k, 64k``. Defaults
            to 10.
        num_stages (int): must be 3 (it is in the signature for classifiers
            that read it). Defaults to 3.
        out_indices (Sequence[int]): stages to output; the last stage's output
            goes through the final norm and ReLU. Defaults to (2,).
        attention (dict, optional): :class:`AAConv2d` arguments for the first
            conv of every block (``None``: the plain network). The paper's
            setting is ``dict(key_ratio=0.2, value_ratio=0.1, num_heads=8,
            min_key_dim_per_head=20)``. Defaults to None.
        dropout (float): dropout inside the blocks. Defaults to 0.
        norm_cfg (dict): norm layers. Defaults to ``dict(type='BN')``.
        init_cfg (dict, optional): mmengine init config. Defaults to None.
    """

    def __init__(self,
                 depth: int = 28,
                 widen_factor: int = 10,
                 num_stages: int = 3,
                 out_indices: Sequence[int] = (2, ),
                 attention: Optional[dict] = None,
                 dropout: float = 0.0,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg)
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(
                f'WideResNet: depth={depth} must be 6 n + 4 with n >= 1 (e.g. '
                f'16, 28, 40)')
        if num_stages != 3:
            raise ValueError(
                f'WideResNet: num_stages={num_stages}; a CIFAR Wide-ResNet '
                f'has 3 stages')
        if not out_indices or any(not 0 <= i < 3 for i in out_indices):
            raise ValueError(
                f'WideResNet: out_indices={tuple(out_indices)} must be within '
                f'(0, 1, 2)')
        blocks = (depth - 4) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.out_indices = tuple(out_indices)
        self.feat_dim = widths[-1]
        self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        in_channels, self.layers = 16, nn.ModuleList()
        for i, width in enumerate(widths):
            stage = [
                WideBasicBlock(in_channels if b == 0 else width, width,
                               (1 if i == 0 else 2) if b == 0 else 1,
                               attention, dropout, norm_cfg)
                for b in range(blocks)
            ]
            self.layers.append(nn.Sequential(*stage))
            in_channels = width
        self.norm = build_norm_layer(norm_cfg, widths[-1])[1]
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> tuple:
        x = self.stem(x)  # [B, 16, H, W]
        outs = []
        for i, layer in enumerate(self.layers):
            x = layer(x)  # [B, 16k * 2^i, H / 2^i, W / 2^i]
            if i == 2:
                x = self.relu(self.norm(x))
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)
