"""Image classifiers for ImageNet / CIFAR pretraining of the backbones."""
from .image_classifier import ImageClassifier

__all__ = ['ImageClassifier']
