"""Top-k classification accuracy for the ImageNet / CIFAR pretraining runs."""
from typing import Sequence

import torch
from mmdet.registry import METRICS
from mmengine.evaluator import BaseMetric


@METRICS.register_module()
class TopKAccuracy(BaseMetric):
    """Top-k accuracy (%) over ``pred_score`` / ``gt_label`` pairs.

    Args:
        topk (Sequence[int]): k values. Defaults to (1, 5).
    """

    default_prefix = 'accuracy'

    def __init__(self, topk: Sequence[int] = (1, 5), **kwargs):
        super().__init__(**kwargs)
        self.topk = tuple(topk)

    def process(self, data_batch, data_samples):
        for sample in data_samples:
            scores, label = sample['pred_score'], int(sample['gt_label'])
            k = min(max(self.topk), scores.numel())
            top = scores.topk(k).indices.tolist()
            self.results.append([label in top[:min(t, k)] for t in self.topk])

    def compute_metrics(self, results):
        hits = torch.tensor(results, dtype=torch.float64)
        return {f'top{k}': 100.0 * hits[:, i].mean().item() for i, k in enumerate(self.topk)}
