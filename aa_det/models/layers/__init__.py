"""Attention layers (no mmdet imports): the AA convolution and the GSA
module."""
from .aa_conv import AAConv2d, aa_channels, relative_attention
from .gsa import GlobalSelfAttention2d

__all__ = [
    'AAConv2d', 'aa_channels', 'relative_attention', 'GlobalSelfAttention2d'
]
