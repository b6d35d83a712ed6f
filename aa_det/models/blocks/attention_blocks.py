"""ResNet blocks whose 3x3 convolution is an attention layer, names and keys
kept.

The blocks of the AA paper (Bello et al., ICCV 2019, Sec. 4.2: "we augment the
3x3 convolutions") and of the GSA paper (Shen et al., Sec. 4: "replace all 3x3
convolutions with GSA modules"): mmdet's ``Bottleneck`` / ``BasicBlock`` with
one conv built from an explicit ``attention`` config (``AAConv`` or ``GSA``,
registered conv layers), the way mmdet's ResNeSt replaces ``conv2``. Every
other part is mmdet's: ``conv1 .. norm3`` and their checkpoint keys,
``downsample``, ``zero_init_residual``, and ``plugins`` (which run around
``conv2`` as in any Bottleneck). ``conv_cfg`` (e.g. mmdet's
``dict(type='ConvWS')``) and ``dcn`` stay free: the block's ``dcn`` (unless its
``fallback_on_stride`` is true, as for mmdet's ``conv2``), else the attention
config's own ``conv_cfg``, else the block's ``conv_cfg`` builds the
convolutional part of an ``AAConv`` (``concat[DCN(X), MHA(X)]``); a ``GSA``
module has none. ``with_cp`` is :class:`~.checkpoint.BlockCheckpoint`'s:
mmdet's recomputation, BatchNorm statistics updated once.

Example:
    >>> import torch
    >>> block = AttentionBottleneck(64, 16,
    ...                             attention=dict(type='AAConv', num_heads=2,
    ...                                            min_key_dim_per_head=4))
    >>> block(torch.rand(1, 64, 9, 13)).shape
    torch.Size([1, 64, 9, 13])
    >>> block = AttentionBasicBlock(8, 16, stride=2,
    ...                             attention=dict(type='GSA', num_heads=2),
    ...                             downsample=torch.nn.Conv2d(8, 16, 1, 2))
    >>> block(torch.rand(1, 8, 9, 13)).shape
    torch.Size([1, 16, 5, 7])
"""
from typing import Optional

from mmcv.cnn import build_conv_layer
from mmdet.models.backbones.resnet import BasicBlock, Bottleneck

from ..layers import AAConv2d
from .checkpoint import BlockCheckpoint


def attention_layer_cfg(attention: dict, conv_cfg: Optional[dict],
                        dcn: Optional[dict]) -> dict:
    """``attention`` with the config of its convolutional part, if it has one
    (``AAConv``).

    Args:
        attention (dict): conv-layer config of the attention layer.
        conv_cfg (dict, optional): the block's ``conv_cfg``; the attention
            config's own ``conv_cfg`` wins over it.
        dcn (dict, optional): the block's ``dcn``; wins over both unless its
            ``fallback_on_stride`` is true, as in mmdet's ``Bottleneck`` (whose
            ``conv2`` is then built by ``conv_cfg``).

    Returns:
        dict: a copy of ``attention``.
    """
    attention = dict(attention)
    if attention['type'] not in ('AAConv', AAConv2d):
        return attention
    if dcn is not None and not dcn.get('fallback_on_stride', False):
        attention['conv_cfg'] = {
            k: v
            for k, v in dcn.items() if k != 'fallback_on_stride'
        }
    elif conv_cfg is not None:
        attention.setdefault('conv_cfg', conv_cfg)
    return attention


class AttentionBottleneck(BlockCheckpoint, Bottleneck):
    """mmdet's ``Bottleneck`` whose 3x3 ``conv2`` is built from ``attention``.

    Args:
        inplanes (int): input channels.
        planes (int): width of the block; ``conv2`` maps ``planes -> planes``.
        attention (dict): conv-layer config of the attention layer, e.g.
            ``dict(type='AAConv', ...)`` or ``dict(type='GSA', ...)``.
        **kwargs: every argument of mmdet's ``Bottleneck`` (``stride``,
            ``dilation``, ``downsample``, ``style``, ``with_cp``, ``conv_cfg``,
            ``norm_cfg``, ``dcn``, ``plugins``, ``init_cfg``). ``dcn`` (unless
            its ``fallback_on_stride`` is true), else ``conv_cfg``, builds the
            attention layer's convolutional part (:func:`attention_layer_cfg`).
    """

    def __init__(self, inplanes: int, planes: int, attention: dict, **kwargs):
        # read before mmdet's Bottleneck pops ``fallback_on_stride`` from it
        dcn = dict(kwargs['dcn']) if kwargs.get('dcn') is not None else None
        super().__init__(inplanes, planes, **kwargs)
        attention = attention_layer_cfg(attention, self.conv_cfg, dcn)
        self.conv2 = build_conv_layer(
            attention,
            planes,
            planes,
            3,
            stride=self.conv2_stride,
            padding=self.dilation,
            dilation=self.dilation,
            bias=False)


class AttentionBasicBlock(BlockCheckpoint, BasicBlock):
    """mmdet's ``BasicBlock`` whose first 3x3 conv (``conv1``, stride and all)
    is built from ``attention``: the reading of the AA paper that gives its
    20.7M for AA-ResNet-34 (docs/design.md), and the paper's choice for
    Wide-ResNets.

    Args:
        inplanes (int): input channels.
        planes (int): output channels.
        attention (dict): conv-layer config of the attention layer.
        stride (int): stride of ``conv1``. Defaults to 1.
        dilation (int): dilation of ``conv1``. Defaults to 1.
        conv_cfg (dict, optional): config of every convolution, the attention
            layer's convolutional part included (:func:`attention_layer_cfg`).
            Defaults to None.
        **kwargs: every other argument of mmdet's ``BasicBlock``.
    """

    def __init__(self,
                 inplanes: int,
                 planes: int,
                 attention: dict,
                 stride: int = 1,
                 dilation: int = 1,
                 conv_cfg: Optional[dict] = None,
                 **kwargs):
        super().__init__(
            inplanes,
            planes,
            stride=stride,
            dilation=dilation,
            conv_cfg=conv_cfg,
            **kwargs)
        attention = attention_layer_cfg(attention, conv_cfg, None)
        self.conv1 = build_conv_layer(
            attention,
            inplanes,
            planes,
            3,
            stride=stride,
            padding=dilation,
            dilation=dilation,
            bias=False)
