"""Attention primitives (no mmdet imports): AA conv, GSA module, their kernels."""
from .aa_conv import AAConv2d, aa_channels
from .gsa import GlobalSelfAttention2d
from .relative_attention import relative_attention

__all__ = ['AAConv2d', 'aa_channels', 'GlobalSelfAttention2d', 'relative_attention']
