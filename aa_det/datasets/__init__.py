"""Datasets: the generated shapes (detection and classification), ImageNet folders, CIFAR-100, and
mmdet's CocoDataset with its checks (CheckedCocoDataset)."""
from .checked_coco import CheckedCocoDataset
from .cifar import CIFAR100Dataset
from .imagenet import ImageNetFolder, build_transform
from .synthetic_shapes import CLASSES, generate_shapes_coco, generate_shapes_folder, generate_shapes_split

__all__ = ['CIFAR100Dataset', 'CLASSES', 'CheckedCocoDataset', 'ImageNetFolder', 'build_transform', 'generate_shapes_coco',
           'generate_shapes_folder', 'generate_shapes_split']
