"""Evaluation metrics registered in mmdet's METRICS."""
from .coco_metric import LenientCocoMetric

__all__ = ['LenientCocoMetric']
