"""mmdet's CocoMetric for annotation files without the optional ``info`` key.

pycocotools 2.0.10's ``COCO.loadRes`` copies the ground truth's ``info``, so an
annotation file without it (many converters write none; mmdet's CocoDataset
trains on it) trained to the end and then failed in evaluation with
``KeyError: 'info'``. Our dataset bases (``configs/_base_/datasets/``) name
:class:`LenientCocoMetric` in the val / test evaluators.
"""
from mmdet.evaluation import CocoMetric
from mmdet.registry import METRICS


@METRICS.register_module()
class LenientCocoMetric(CocoMetric):
    """mmdet's :class:`CocoMetric`, also for annotation files without ``info``.

    Arguments, results and metric names (``coco/bbox_mAP``, ...) are
    ``CocoMetric``'s. The one difference: when the ground-truth file has no
    top-level ``info``, its COCO api gets an empty one (``{}``), which is all
    ``loadRes`` needs; the file itself is not changed.

    Args:
        *args: Positional arguments passed to :class:`CocoMetric`.
        **kwargs: Keyword arguments passed to :class:`CocoMetric`.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._coco_api is not None:  # None: mmdet converts the dataset, with an info
            self._coco_api.dataset.setdefault('info', {})
