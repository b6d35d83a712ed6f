"""mmdet's CocoMetric for annotation files without the optional ``info`` key,
which our dataset bases (``configs/_base_/datasets/``) name: pycocotools
2.0.10's ``COCO.loadRes`` copies the ground truth's ``info``, so such a file
(many converters write none; mmdet trains on it) trained to the end and then
failed in evaluation with ``KeyError: 'info'``."""
from mmdet.evaluation import CocoMetric
from mmdet.registry import METRICS


@METRICS.register_module()
class LenientCocoMetric(CocoMetric):
    """mmdet's :class:`CocoMetric` (its arguments, results and metric names); a
    ground truth without a top-level ``info`` gets an empty one in its COCO
    api, all ``loadRes`` needs (the file is unchanged)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # None: mmdet converts the dataset, with an info
        if self._coco_api is not None:
            self._coco_api.dataset.setdefault('info', {})
