"""The shared frame of AA-ResNet and GSA-ResNet: mmdet's ResNet with attention stages.

Follows mmdet's ``ResNeSt``: blocks of their own (:mod:`aa_det.models.blocks`) take an explicit
``attention`` conv config, and :meth:`AttentionResNet.make_res_layer` hands it to the stages
listed in ``stage_with_attention``. mmdet's ``dcn`` / ``stage_with_dcn`` and ``plugins`` stay
free and combine with attention.

Example:
    >>> import torch
    >>> model = AttentionResNet(depth=18, base_channels=16,
    ...                         attention=dict(type='GSA', num_heads=2),
    ...                         stage_with_attention=(False, False, True, True))
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 64, 96))]
    [(1, 16, 16, 24), (1, 32, 8, 12), (1, 64, 4, 6), (1, 128, 2, 3)]
"""
from typing import Sequence

from mmdet.models.backbones.resnet import BasicBlock, Bottleneck, ResNet

from ..blocks import AttentionBasicBlock, AttentionBottleneck


class AttentionResNet(ResNet):
    """mmdet's ``ResNet`` whose blocks in chosen stages replace a 3x3 conv by attention.

    Takes every argument of mmdet's ``ResNet`` (``depth``, ``num_stages``,
    ``out_indices``, ``frozen_stages``, ``norm_cfg``, ``norm_eval``, ``with_cp``,
    ``style``, ``zero_init_residual``, ``dcn``, ``stage_with_dcn``, ``plugins``,
    ``init_cfg``, ...) plus:

    Args:
        attention (dict): conv-layer config of the attention layer
            (``dict(type='AAConv', ...)`` or ``dict(type='GSA', ...)``).
        stage_with_attention (Sequence[bool]): stages whose blocks use it.
    """

    #: mmdet's block -> the same block with an attention layer
    attention_blocks = {Bottleneck: AttentionBottleneck, BasicBlock: AttentionBasicBlock}

    def __init__(self, depth: int, attention: dict, stage_with_attention: Sequence[bool], **kwargs):
        name = type(self).__name__
        if depth not in self.arch_settings:
            raise KeyError(f'{name}: invalid depth {depth}; choose from {sorted(self.arch_settings)}')
        num_stages = kwargs.get('num_stages', 4)
        stage_with_attention = tuple(stage_with_attention)
        if len(stage_with_attention) < num_stages:
            raise ValueError(f'{name}: stage_with_attention={stage_with_attention} needs '
                             f'num_stages={num_stages} entries')
        self.attention = dict(attention)
        self.stage_with_attention = stage_with_attention[:num_stages]
        super().__init__(depth, **kwargs)

    def stage_attention(self, stage: int) -> dict:
        """The attention config of ``stage`` (0-based); subclasses add per-stage settings."""
        return dict(self.attention)

    def make_res_layer(self, **kwargs):
        """mmdet's ``ResLayer``; in an attention stage with the attention blocks and config."""
        stage = len(self.res_layers)  # mmdet's ResNet records each stage's name after building it
        if self.stage_with_attention[stage]:
            kwargs['block'] = self.attention_blocks[kwargs['block']]
            kwargs['attention'] = self.stage_attention(stage)
        return super().make_res_layer(**kwargs)
