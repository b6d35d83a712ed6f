"""ResNet blocks with an attention layer in place of a 3x3 conv (mmdet's blocks, names kept)."""
from .attention_blocks import AttentionBasicBlock, AttentionBottleneck

__all__ = ['AttentionBasicBlock', 'AttentionBottleneck']
