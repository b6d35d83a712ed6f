"""mmdet's CocoDataset with its checks (CheckedCocoDataset)."""
from .checked_coco import CheckedCocoDataset

__all__ = ['CheckedCocoDataset']
