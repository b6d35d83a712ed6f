"""AA-ResNet: ResNet whose 3x3 convolutions are attention augmented.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, Sec. 4.2:
every residual block of the last three stages (28x28, 14x14 and 7x7 at 224 input)
augments its 3x3 convolution, ``kappa = 2 upsilon = 0.2`` (ResNet-34:
``kappa = upsilon = 0.25``), 8 heads, attention downsampling only in the first
augmented stage. Bottleneck blocks augment ``conv2``; basic blocks ``conv1`` (the
reading that gives the paper's 20.7M for AA-ResNet-34, docs/design.md).

Example:
    >>> import torch
    >>> from aa_det.models.backbones import AAResNet
    >>> model = AAResNet(depth=18, attention=dict(min_key_dim_per_head=4))
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 67, 93))]
    [(1, 64, 17, 24), (1, 128, 9, 12), (1, 256, 5, 6), (1, 512, 3, 3)]
"""
from typing import Optional, Sequence

from mmdet.registry import MODELS

from .attention_resnet import AttentionResNet


@MODELS.register_module()
class AAResNet(AttentionResNet):
    """Attention Augmented ResNet (AA paper, Sec. 4.2, Table 2).

    Takes every argument of mmdet's ``ResNet`` (``dcn``, ``plugins`` included; with
    ``dcn`` an augmented conv's convolutional part is deformable) plus:

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

    def __init__(self,
                 depth: int,
                 attention: Optional[dict] = None,
                 stage_with_attention: Sequence[bool] = (False, True, True, True),
                 attn_downsample_stages: Optional[Sequence[bool]] = None,
                 **kwargs):
        ratio = 0.25 if depth in (18, 34) else None
        cfg = dict(type='AAConv', key_ratio=ratio or 0.2, value_ratio=ratio or 0.1, num_heads=8)
        cfg.update(attention or {})
        num_stages = kwargs.get('num_stages', 4)
        if attn_downsample_stages is None:
            augmented = tuple(stage_with_attention)[:num_stages]
            first = augmented.index(True) if any(augmented) else -1
            attn_downsample_stages = [i == first for i in range(num_stages)]
        if len(attn_downsample_stages) < num_stages:
            raise ValueError(f'AAResNet: attn_downsample_stages={attn_downsample_stages} needs '
                             f'num_stages={num_stages} entries')
        self.attn_downsample_stages = tuple(attn_downsample_stages)
        super().__init__(depth, attention=cfg, stage_with_attention=stage_with_attention, **kwargs)

    def stage_attention(self, stage: int) -> dict:
        return dict(self.attention, attn_downsample=self.attn_downsample_stages[stage])
