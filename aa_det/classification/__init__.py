"""ImageNet classification path: pretrain the backbones the detectors load."""
from .classifier import ImageClassifier
from .data import ImageNetFolder, TopKAccuracy, build_transform

__all__ = ['ImageClassifier', 'ImageNetFolder', 'TopKAccuracy', 'build_transform']
