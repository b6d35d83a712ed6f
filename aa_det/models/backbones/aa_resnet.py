"""AA-ResNet: ResNet whose 3x3 convolutions are attention augmented.

Bello et al., *Attention Augmented Convolutional Networks*, ICCV 2019, Sec.
4.2: every residual block of the last three stages (28x28, 14x14 and 7x7 at 224
input) augments its 3x3 convolution, ``kappa = 2 upsilon = 0.2`` (ResNet-34:
``kappa = upsilon = 0.25``), 8 heads, attention downsampling only in the first
augmented stage. Bottleneck blocks augment ``conv2``; basic blocks ``conv1``
(the reading that gives the paper's 20.7M for AA-ResNet-34, docs/design.md).

Example:
    >>> import torch
    >>> from aa_det.models.backbones import AAResNet
    >>> model = AAResNet(depth=18, attention=dict(min_key_dim_per_head=4))
    >>> [tuple(o.shape) for o in model(torch.rand(1, 3, 67, 93))]
    [(1, 64, 17, 24), (1, 128, 9, 12), (1, 256, 5, 6), (1, 512, 3, 3)]
"""
from typing import Optional, Sequence

from mmdet.registry import MODELS

from ..layers import aa_channels
from .attention_resnet import AttentionResNet, check_per_stage


@MODELS.register_module()
class AAResNet(AttentionResNet):
    """Attention Augmented ResNet (AA paper, Sec. 4.2, Table 2).

    Takes every argument of mmdet's ``ResNet`` (``dcn``, ``plugins`` included
    at the bottleneck depths; with ``dcn`` an augmented conv's convolutional
    part is deformable) plus:

    Args:
        attention (dict, optional): overrides of the ``AAConv`` config
            (``key_ratio``, ``value_ratio``, ``num_heads``, ``position``,
            ``max_rel_dist``, ``min_key_dim_per_head``, ``impl``; see
            :class:`aa_det.models.layers.AAConv2d`). Defaults: ``kappa = 0.2``,
            ``upsilon = 0.1`` (depth 18/34: 0.25 / 0.25), 8 heads, relative.
        stage_with_attention (Sequence[bool], optional): augmented stages, one
            entry per stage. Defaults to all but the first:
            ``(False, True, True, True)`` with mmdet's four stages,
            ``(False, True, True)`` with ``num_stages=3``.
        attn_downsample_stages (Sequence[bool], optional): stages whose
            attention runs on a 2x average-pooled input. Defaults to the first
            augmented stage only.
    """

    def __init__(self,
                 depth: int,
                 attention: Optional[dict] = None,
                 stage_with_attention: Optional[Sequence[bool]] = None,
                 attn_downsample_stages: Optional[Sequence[bool]] = None,
                 **kwargs):
        ratio = 0.25 if depth in (18, 34) else None
        cfg = dict(
            type='AAConv',
            key_ratio=ratio or 0.2,
            value_ratio=ratio or 0.1,
            num_heads=8)
        cfg.update(attention or {})
        num_stages = kwargs.get('num_stages', 4)
        # the default follows num_stages, as mmdet's per-stage settings do
        if stage_with_attention is None:
            stage_with_attention = tuple(i > 0 for i in range(num_stages))
        check_per_stage(
            'AAResNet',
            num_stages,
            stage_with_attention=stage_with_attention,
            attn_downsample_stages=attn_downsample_stages)
        if attn_downsample_stages is None:
            first = tuple(stage_with_attention).index(True) if any(
                stage_with_attention) else -1
            attn_downsample_stages = [i == first for i in range(num_stages)]
        self.attn_downsample_stages = tuple(attn_downsample_stages)
        self.check_conv_channels(cfg, kwargs.get('base_channels', 64),
                                 stage_with_attention)
        super().__init__(
            depth,
            attention=cfg,
            stage_with_attention=stage_with_attention,
            **kwargs)

    @staticmethod
    def check_conv_channels(cfg: dict, base_channels: int,
                            stage_with_attention: Sequence[bool]):
        """Refuse a ``base_channels`` at which an augmented conv has no
        convolutional part left (``dv`` rounds up to its width,
        :func:`aa_channels`), naming the smallest that works.

        A fully attentional network (``value_ratio=1.0``) or an explicit
        ``value_channels`` is left to :class:`AAConv2d`.
        """
        if cfg.get('value_channels') is not None or cfg.get(
                'value_ratio', 0.1) >= 1:
            return
        stages = [
            i for i, augmented in enumerate(stage_with_attention) if augmented
        ]

        # the augmented conv of stage i has base * 2**i output channels
        def fits(base):
            return all(
                aa_channels(
                    base * 2**i, cfg.get('key_ratio', 0.2),
                    cfg.get('value_ratio', 0.1), cfg.get('num_heads', 8),
                    cfg.get('min_key_dim_per_head', 20))[1] < base * 2**i
                for i in stages)

        if not fits(base_channels):
            smallest = next(base for base in range(1, 1 << 16) if fits(base))
            raise ValueError(
                f'AAResNet: base_channels={base_channels} leaves no '
                f'convolutional channels in an augmented conv '
                f'(value_ratio={cfg.get("value_ratio", 0.1)} rounds dv up to '
                f'a multiple of num_heads={cfg.get("num_heads", 8)}); use '
                f'base_channels >= {smallest}, fewer num_heads, or '
                f'value_ratio=1.0 for a fully attentional network')

    # set per stage from attn_downsample_stages
    stage_keys = ('attn_downsample', )

    def stage_attention(self, stage: int) -> dict:
        return dict(
            self.attention, attn_downsample=self.attn_downsample_stages[stage])
