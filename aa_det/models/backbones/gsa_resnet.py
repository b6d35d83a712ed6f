"""GSA-ResNet: ResNet whose 3x3 convolutions are global self-attention modules.

Shen et al., *Global Self-Attention Networks for Image Recognition*, Sec. 3.2
and 4: every 3x3 conv of the selected stages is a GSA module (8 heads, keys /
queries / values with the input's channels); spatial reduction by a 2x2 average
pool (stride 2) right after the first GSA module of stages 2-4; BN after every
1x1 conv and GSA module; the stem stays convolutional. ResNet-26 / -38 are the
bottleneck layouts of Ramachandran et al. (2019).

Example:
    >>> import torch
    >>> from aa_det.models.backbones import GSAResNet
    >>> model = GSAResNet(depth=26)
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 67, 93))]
    [(1, 256, 17, 24), (1, 512, 9, 12), (1, 1024, 5, 6), (1, 2048, 3, 3)]
"""
from typing import Optional, Sequence

from mmdet.models.backbones.resnet import Bottleneck
from mmdet.registry import MODELS

from .attention_resnet import AttentionResNet, check_per_stage


@MODELS.register_module()
class GSAResNet(AttentionResNet):
    """Global Self-Attention ResNet (GSA paper, Table 6).

    Takes every argument of mmdet's ``ResNet`` (``plugins`` included;
    ``conv_cfg`` builds the stem, 1x1 and shortcut convs, a GSA module has no
    convolution) plus:

    Args:
        attention (dict, optional): overrides of the ``GSA`` module config
            (``num_heads``, ``components``, ``max_rel_dist``, ``key_channels``;
            see :class:`aa_det.models.layers.GlobalSelfAttention2d`). Its norm
            between column and row attention follows ``norm_cfg``.
        stage_with_attention (Sequence[bool], optional): stages whose 3x3 convs
            are replaced (GSA Table 5), one entry per stage. Defaults to every
            stage (``num_stages`` of them).
    """

    arch_settings = {
        26: (Bottleneck, (1, 2, 4, 1)),
        38: (Bottleneck, (2, 3, 5, 2)),
        50: (Bottleneck, (3, 4, 6, 3)),
        101: (Bottleneck, (3, 4, 23, 3)),
    }

    def __init__(self,
                 depth: int,
                 attention: Optional[dict] = None,
                 stage_with_attention: Optional[Sequence[bool]] = None,
                 **kwargs):
        cfg = dict(
            type='GSA',
            num_heads=8,
            norm_cfg=kwargs.get('norm_cfg',
                                dict(type='BN', requires_grad=True)))
        cfg.update(attention or {})
        if stage_with_attention is None:  # the default follows num_stages
            stage_with_attention = (True, ) * kwargs.get('num_stages', 4)
        check_per_stage(
            'GSAResNet',
            kwargs.get('num_stages', 4),
            stage_with_attention=stage_with_attention,
            stage_with_dcn=kwargs.get('stage_with_dcn')
            if kwargs.get('dcn') else None)
        dcn_stages = [
            i for i, (a, d) in enumerate(
                zip(stage_with_attention, kwargs.get('stage_with_dcn', ())))
            if a and d and kwargs.get('dcn') is not None
        ]
        if dcn_stages:
            raise ValueError(
                f'GSAResNet: dcn and GSA both replace conv2 in stage(s) '
                f'{[i + 1 for i in dcn_stages]}; a GSA module has no '
                f'convolution to deform (set stage_with_dcn False there, or '
                f'use a plugin)')
        super().__init__(
            depth,
            attention=cfg,
            stage_with_attention=stage_with_attention,
            **kwargs)
