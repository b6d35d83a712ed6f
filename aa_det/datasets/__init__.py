"""Datasets: the generated shapes (detection and classification) and mmdet's CocoDataset with its checks
(CheckedCocoDataset)."""
from .checked_coco import CheckedCocoDataset
from .synthetic_shapes import CLASSES, generate_shapes_coco, generate_shapes_folder, generate_shapes_split

__all__ = ['CLASSES', 'CheckedCocoDataset', 'generate_shapes_coco', 'generate_shapes_folder',
           'generate_shapes_split']
