"""mmdet's focal loss (Lin et al., *Focal Loss for Dense Object Detection*,
RetinaNet's classification loss) for bf16 predictions: computed in float32.

Under bf16 autocast (``AmpOptimWrapper(dtype='bfloat16')``) RetinaNet's
classification logits are bf16, and mmcv 2.1.0's ``sigmoid_focal_loss`` CUDA
kernel, which mmdet's ``FocalLoss`` calls on GPUs, has no bf16 instantiation:
the first step stopped with
``"sigmoid_focal_loss_forward_cuda_kernel" not implemented for 'BFloat16'``.
The RetinaNet bases (``configs/_base_/models/``) name
:class:`Float32FocalLoss`.

Example:
    >>> import torch
    >>> loss = Float32FocalLoss(use_sigmoid=True)
    >>> loss(torch.randn(6, 3, dtype=torch.bfloat16),
    ...      torch.tensor([0, 1, 2, 3, 0, 1])).dtype
    torch.float32
"""
import torch
from mmdet.models.losses import FocalLoss
from mmdet.registry import MODELS


@MODELS.register_module()
class Float32FocalLoss(FocalLoss):
    """mmdet's :class:`FocalLoss`, with bf16 predictions cast to float32 first
    (one cast, whose backward casts the gradient back). float32 and fp16
    predictions take mmdet's path unchanged (mmcv's kernel has float32 and fp16
    instantiations).

    Args:
        **kwargs: Keyword arguments of mmdet's :class:`FocalLoss`
            (``use_sigmoid``, ``gamma``, ``alpha``, ``reduction``,
            ``loss_weight``, ``activated``).
    """

    def forward(self, pred: torch.Tensor, target: torch.Tensor, *args,
                **kwargs) -> torch.Tensor:
        """The focal loss of ``pred`` (float32 if it is bf16) against
        ``target``; the other arguments are :meth:`FocalLoss.forward`'s."""
        if pred.dtype == torch.bfloat16:
            pred = pred.float()
        return super().forward(pred, target, *args, **kwargs)
