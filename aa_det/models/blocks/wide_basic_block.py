"""Pre-activation Wide-ResNet basic block (Zagoruyko & Komodakis, BMVC 2016),
whose first conv the AA paper (Bello et al., ICCV 2019, Sec. 4.1) augments with
relative attention."""
from typing import Optional

import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule
from torch import Tensor

from ..layers import AAConv2d


class WideBasicBlock(BaseModule):
    """Pre-activation basic block:
    ``norm1-relu-conv1-norm2-relu-dropout-conv2`` + shortcut.

    Args:
        in_channels (int): input channels.
        out_channels (int): output channels.
        stride (int): stride of ``conv1`` and of the 1x1 shortcut. Defaults
            to 1.
        attention (dict, optional): :class:`AAConv2d` arguments; ``conv1``
            becomes an AA conv when given. Defaults to None.
        dropout (float): dropout between the convolutions. Defaults to 0.
        norm_cfg (dict): norm layers. Defaults to ``dict(type='BN')``.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 stride: int = 1,
                 attention: Optional[dict] = None,
                 dropout: float = 0.0,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg)
        self.norm1 = build_norm_layer(norm_cfg, in_channels)[1]
        if attention is None:
            self.conv1 = nn.Conv2d(
                in_channels, out_channels, 3, stride, 1, bias=False)
        else:
            self.conv1 = AAConv2d(in_channels, out_channels, 3, stride,
                                  **attention)
        self.norm2 = build_norm_layer(norm_cfg, out_channels)[1]
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Conv2d(
                in_channels, out_channels, 1, stride, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        act = self.relu(self.norm1(x))
        out = self.conv2(self.dropout(self.relu(self.norm2(self.conv1(act)))))
        # as the WRN reference code: a projection shortcut takes the
        # pre-activated input
        return out + (x if self.shortcut is None else self.shortcut(act))
