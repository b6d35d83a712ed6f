"""AA-ResNet: ResNet whose 3x3 convolutions are attention augmented.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, Sec. 4.2:
every residual block of the last three stages (28x28, 14x14 and 7x7 at 224 input)
augments its 3x3 convolution, ``kappa = 2 upsilon = 0.2`` (ResNet-34:
``kappa = upsilon = 0.25``), 8 heads, attention downsampling only in the first
augmented stage. Bottleneck blocks get the AA conv as ``conv2`` through mmdet's
per-stage ``dcn`` hook (the way DCN slots in); basic blocks augment ``conv1``
(the reading that gives the paper's 20.7M for AA-ResNet-34, docs/design.md).

Example:
    >>> import torch
    >>> from aa_det.models.backbones import AAResNet
    >>> model = AAResNet(depth=18, attention=dict(min_key_dim_per_head=4))
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 67, 93))]
    [(1, 64, 17, 24), (1, 128, 9, 12), (1, 256, 5, 6), (1, 512, 3, 3)]
"""
import math
from typing import Optional, Sequence

from mmcv.cnn import build_conv_layer
from mmdet.models.backbones.resnet import BasicBlock, ResNet
from mmdet.registry import MODELS


class AABasicBlock(BasicBlock):
    """mmdet's ``BasicBlock`` whose first 3x3 conv is built from ``dcn``
    (an attention conv config); all names (``conv1`` .. ``norm2``) are kept."""

    def __init__(self, inplanes, planes, stride=1, dilation=1, dcn=None, **kwargs):
        super().__init__(inplanes, planes, stride=stride, dilation=dilation, **kwargs)
        if dcn is not None:
            self.conv1 = build_conv_layer(dcn, inplanes, planes, 3, stride=stride,
                                          padding=dilation, dilation=dilation, bias=False)


@MODELS.register_module()
class AAResNet(ResNet):
    """Attention Augmented ResNet (AA paper, Sec. 4.2, Table 2).

    Takes every argument of mmdet's ``ResNet`` (``depth``, ``num_stages``,
    ``out_indices``, ``frozen_stages``, ``norm_cfg``, ``norm_eval``, ``with_cp``,
    ``style``, ``zero_init_residual``, ``init_cfg``, ...) plus:

    Args:
        attention (dict, optional): overrides of the ``AAConv`` config
            (``key_ratio``, ``value_ratio``, ``num_heads``, ``position``,
            ``max_rel_dist``, ``min_key_dim_per_head``, ``impl``; see
            :class:`aa_det.models.layers.AAConv2d`). Defaults: ``kappa = 0.2``,
            ``upsilon = 0.1`` (depth 18/34: 0.25 / 0.25), 8 heads, relative.
        stage_with_attention (Sequence[bool]): augmented stages. Defaults to
            the last three, ``(False, True, True, True)``.
        attn_downsample_stages (Sequence[bool], optional): stages whose
            attention runs on a 2x average-pooled input. Defaults to the first
            augmented stage only.
    """

    arch_settings = ResNet.arch_settings

    def __init__(self,
                 depth: int,
                 attention: Optional[dict] = None,
                 stage_with_attention: Sequence[bool] = (False, True, True, True),
                 attn_downsample_stages: Optional[Sequence[bool]] = None,
                 **kwargs):
        if depth not in self.arch_settings:
            raise KeyError(f'AAResNet: invalid depth {depth}; choose from {sorted(self.arch_settings)}')
        ratio = 0.25 if depth in (18, 34) else None
        cfg = dict(type='AAConv', key_ratio=ratio or 0.2, value_ratio=ratio or 0.1, num_heads=8)
        cfg.update(attention or {})
        num_stages = kwargs.get('num_stages', 4)
        stage_with_attention = tuple(stage_with_attention)[:num_stages]
        if attn_downsample_stages is None:
            first = stage_with_attention.index(True) if any(stage_with_attention) else -1
            attn_downsample_stages = [i == first for i in range(num_stages)]
        if len(stage_with_attention) != num_stages or len(attn_downsample_stages) < num_stages:
            raise ValueError(f'AAResNet: stage_with_attention={stage_with_attention} and '
                             f'attn_downsample_stages={attn_downsample_stages} need '
                             f'num_stages={num_stages} entries')
        self.attn_downsample_stages = tuple(attn_downsample_stages)
        super().__init__(depth, dcn=cfg if any(stage_with_attention) else None,
                         stage_with_dcn=stage_with_attention, **kwargs)

    def make_res_layer(self, **kwargs):
        """mmdet's ``ResLayer`` with the stage's attention conv config as ``dcn``."""
        if kwargs.get('dcn') is not None:
            stage = int(math.log2(kwargs['planes'] // self.base_channels))
            kwargs['dcn'] = dict(kwargs['dcn'], attn_downsample=self.attn_downsample_stages[stage])
            if kwargs['block'] is BasicBlock:
                kwargs['block'] = AABasicBlock
        return super().make_res_layer(**kwargs)
