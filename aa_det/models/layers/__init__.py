"""Attention primitives (no mmdet imports): AA conv, GSA module and their kernels
(``relative_attention.relative_attention``)."""
from .aa_conv import AAConv2d, aa_channels
from .gsa import GlobalSelfAttention2d

__all__ = ['AAConv2d', 'aa_channels', 'GlobalSelfAttention2d']
