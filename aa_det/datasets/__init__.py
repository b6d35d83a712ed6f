"""Datasets: the generated shapes (detection and classification), mmdet's CocoDataset with its checks
(CheckedCocoDataset), and the checks of mmpretrain's classification datasets
(check_classification_data)."""
from .checked_coco import CheckedCocoDataset
from .classification_checks import check_classification_data
from .synthetic_shapes import CLASSES, generate_shapes_coco, generate_shapes_folder, generate_shapes_split

__all__ = ['CLASSES', 'CheckedCocoDataset', 'check_classification_data', 'generate_shapes_coco',
           'generate_shapes_folder', 'generate_shapes_split']
