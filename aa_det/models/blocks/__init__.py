"""Residual blocks whose 3x3 conv is an attention layer: mmdet's ResNet blocks
(names kept) and the pre-activation Wide-ResNet block."""
from .attention_blocks import AttentionBasicBlock, AttentionBottleneck
from .checkpoint import BlockCheckpoint, PlainBasicBlock, PlainBottleneck
from .wide_basic_block import WideBasicBlock

__all__ = [
    'AttentionBasicBlock', 'AttentionBottleneck', 'BlockCheckpoint',
    'PlainBasicBlock', 'PlainBottleneck', 'WideBasicBlock'
]
