"""Datasets: the generated shapes (detection and classification), ImageNet folders, CIFAR-100."""
from .cifar import CIFAR100Dataset
from .imagenet import ImageNetFolder, build_transform
from .synthetic_shapes import CLASSES, generate_shapes_coco, generate_shapes_folder, generate_shapes_split

__all__ = ['CIFAR100Dataset', 'CLASSES', 'ImageNetFolder', 'build_transform', 'generate_shapes_coco',
           'generate_shapes_folder', 'generate_shapes_split']
