"""Evaluation metrics registered in mmdet's METRICS."""
from .accuracy import TopKAccuracy
from .coco_metric import LenientCocoMetric

__all__ = ['LenientCocoMetric', 'TopKAccuracy']
