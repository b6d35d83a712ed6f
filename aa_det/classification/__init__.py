"""Classification path (ImageNet, CIFAR-100): pretrain the backbones the detectors load."""
from .classifier import ImageClassifier
from .data import CIFAR100Dataset, ImageNetFolder, TopKAccuracy, build_transform

__all__ = ['CIFAR100Dataset', 'ImageClassifier', 'ImageNetFolder', 'TopKAccuracy', 'build_transform']
