"""Evaluation metrics registered in mmdet's METRICS (classification uses
mmpretrain's Accuracy)."""
from .coco_metric import LenientCocoMetric

__all__ = ['LenientCocoMetric']
