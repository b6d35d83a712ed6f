"""Image classifier for ImageNet pretraining: backbone -> global average pool -> linear.

The backbone is any mmdet backbone (``ResNet``, ``AAResNet``, ``GSAResNet``); its
state-dict keys are ``backbone.*``, so a detector loads the trunk with
``init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.

Example:
    >>> import torch, aa_det
    >>> from mmdet.registry import MODELS
    >>> model = MODELS.build(dict(type='ImageClassifier', num_classes=10,
    ...                           backbone=dict(type='AAResNet', depth=18, base_channels=16,
    ...                                         attention=dict(num_heads=2, min_key_dim_per_head=4))))
    >>> model(torch.rand(2, 3, 64, 64), mode='tensor').shape
    torch.Size([2, 10])
"""
from typing import List, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmengine.model import BaseModel


@MODELS.register_module()
class ImageClassifier(BaseModel):
    """Backbone + global average pooling + linear head, trained with cross-entropy.

    Args:
        backbone (dict): backbone config; its last stage feeds the head.
        num_classes (int): classes. Defaults to 1000.
        label_smoothing (float): cross-entropy label smoothing (GSA uses 0.1).
            Defaults to 0.
        data_preprocessor (dict, optional): mmengine ``ImgDataPreprocessor``
            config (mean / std normalisation; images arrive as RGB).
        init_cfg (dict, optional): init config of the head.
    """

    def __init__(self, backbone: dict, num_classes: int = 1000, label_smoothing: float = 0.0,
                 data_preprocessor: Optional[dict] = None, init_cfg: Optional[dict] = None):
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if num_classes < 1:
            raise ValueError(f'ImageClassifier: num_classes must be >= 1, got {num_classes}')
        backbone = dict(backbone)
        last = backbone.get('num_stages', 4) - 1
        backbone.setdefault('out_indices', (last,))  # last stage only
        if max(backbone['out_indices']) != last:
            raise ValueError(f'ImageClassifier: backbone.out_indices={backbone["out_indices"]} must end '
                             f'with the last stage ({last}), whose features the head classifies')
        self.backbone = MODELS.build(backbone)
        self.head = nn.Linear(self.backbone.feat_dim, num_classes)
        self.num_classes, self.label_smoothing = num_classes, label_smoothing

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` images -> ``[B, num_classes]`` logits."""
        feats = self.backbone(inputs)[-1]  # [B, C, h, w]
        return self.head(feats.mean((2, 3)))

    def forward(self, inputs: torch.Tensor, data_samples: Optional[Union[List, torch.Tensor]] = None,
                mode: str = 'tensor'):
        logits = self.logits(inputs)
        if mode == 'tensor':
            return logits
        if mode == 'predict' and data_samples is None:  # inference without labels
            return [dict(pred_score=s) for s in logits.float().softmax(-1)]
        labels = torch.as_tensor(data_samples, device=logits.device) if not torch.is_tensor(data_samples) \
            else data_samples.to(logits.device)
        if mode == 'loss':
            return dict(loss_cls=F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing))
        if mode == 'predict':
            scores = logits.float().softmax(-1)
            return [dict(pred_score=s, gt_label=l) for s, l in zip(scores, labels)]
        raise ValueError(f"ImageClassifier: mode must be 'tensor', 'loss' or 'predict', got {mode!r}")
