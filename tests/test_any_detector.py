"""AAResNet and GSAResNet in mmdet's own detector configs.

A user swaps our backbones into an mmdet detector from scratch on top of
mmdet's config, as the README's snippet does::

    _base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
    model = dict(
        backbone=dict(type='AAResNet', init_cfg=None, frozen_stages=-1,
                      norm_eval=False,
                      norm_cfg=dict(type='BN', requires_grad=True)))

The config's other ResNet settings (depth 50, ``out_indices``, ``style``) are
kept, so the neck's ``in_channels`` still match; ``init_cfg=None`` and nothing
frozen because the config's ImageNet ResNet checkpoint is not one of these
backbones (``tests/test_user_configs.py`` trains the README's snippets with
mmdet's tools).

For Faster R-CNN, Mask R-CNN, Cascade R-CNN, FCOS, ATSS and 4-scale DINO, each
case writes that user config, builds the model with ``MODELS.build`` in mmdet's
scope, runs one SGD step through the model's ``train_step`` on two small
generated images and one prediction through ``test_step``. The step must give a
finite loss, run every attention layer of the backbone and update the backbone;
the prediction must give one ``DetDataSample`` per image with finite boxes.
Only proposal, sampler and query counts are made smaller, for the CPU; the
detectors' architectures are mmdet's.
"""
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmengine.config import Config
from mmengine.optim import OptimWrapper
from mmengine.registry import DefaultScope, init_default_scope
from mmengine.structures import InstanceData

import aa_det  # noqa: F401  (registers AAResNet, GSAResNet)
from aa_det.models.layers import AAConv2d
from aa_det.models.layers.gsa import GlobalSelfAttention2d

# two-stage detectors: fewer proposals and sampled RoIs than at COCO scale
_RPN = {
    'model.train_cfg.rpn_proposal.nms_pre': 200,
    'model.train_cfg.rpn_proposal.max_per_img': 100,
    'model.test_cfg.rpn.nms_pre': 200,
    'model.test_cfg.rpn.max_per_img': 50,
}
# one-stage detectors
_DENSE = {'model.test_cfg.nms_pre': 200, 'model.test_cfg.max_per_img': 20}

# detector -> (mmdet config, overrides that only shrink counts)
DETECTORS = {
    'faster_rcnn': ('mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', {
        **_RPN, 'model.train_cfg.rcnn.sampler.num': 64
    }),
    'mask_rcnn': ('mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', {
        **_RPN, 'model.train_cfg.rcnn.sampler.num': 64
    }),
    'cascade_rcnn': ('mmdet::cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py', {
        **_RPN,
        **{f'model.train_cfg.rcnn.{i}.sampler.num': 64
           for i in range(3)}
    }),
    'fcos': ('mmdet::fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py', _DENSE),
    'atss': ('mmdet::atss/atss_r50_fpn_1x_coco.py', _DENSE),
    'dino': ('mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', {
        'model.num_queries': 30,
        'model.dn_cfg.group_cfg.num_dn_queries': 10,
        'model.test_cfg.max_per_img': 20
    }),
}
BACKBONES = {'AAResNet': AAConv2d, 'GSAResNet': GlobalSelfAttention2d}
# (h, w): two sizes, so the preprocessor pads the batch
IMAGE_SHAPES = ((64, 64), (64, 96))


def build_detector(tmp_path, base, backbone, overrides):
    """A user's config: mmdet's detector with our backbone, one line; then
    ``--cfg-options``."""
    path = tmp_path / f'{backbone}_{osp.basename(base)}'
    path.write_text(
        f"_base_ = {base!r}\nmodel = dict(backbone=dict(type={backbone!r}, "
        f"init_cfg=None, frozen_stages=-1, norm_eval=False,\n                 "
        f"          norm_cfg=dict(type='BN', requires_grad=True)))\n")
    cfg = Config.fromfile(str(path))
    cfg.merge_from_dict(overrides)
    assert cfg.model.backbone.depth == 50
    init_default_scope(cfg.default_scope)
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    # as the Runner does; nothing to download with init_cfg=None
    model.init_weights()
    assert type(model.backbone).__name__ == backbone
    return model


def batch(with_gt, with_masks=False):
    """Two generated images with two boxes each, as mmdet's PackDetInputs gives
    them."""
    gen = torch.Generator().manual_seed(0)
    inputs, data_samples = [], []
    for h, w in IMAGE_SHAPES:
        inputs.append(
            torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen))
        sample = DetDataSample(
            metainfo=dict(
                img_id=len(inputs),
                img_shape=(h, w),
                ori_shape=(h, w),
                scale_factor=(1.0, 1.0),
                flip=False))
        if with_gt:
            boxes = torch.tensor([[4., 6., 36., 40.],
                                  [24., 20., w - 6., h - 4.]])
            gt = InstanceData(bboxes=boxes, labels=torch.tensor([1, 7]))
            if with_masks:
                masks = torch.zeros(len(boxes), h, w, dtype=torch.uint8)
                for mask, (x1, y1, x2, y2) in zip(masks,
                                                  boxes.long().tolist()):
                    mask[y1:y2, x1:x2] = 1
                gt.masks = BitmapMasks(masks.numpy(), h, w)
            sample.gt_instances = gt
        data_samples.append(sample)
    return dict(inputs=inputs, data_samples=data_samples)


@pytest.mark.parametrize('backbone', list(BACKBONES))
@pytest.mark.parametrize(
    'detector',
    [
        d if d == 'faster_rcnn' else pytest.param(d, marks=pytest.mark.slow)
        # the others 10-50 s each: .ci/run runs
        # them
        for d in DETECTORS
    ])
def test_backbone_trains_and_predicts_in_mmdet_detector(
        tmp_path, detector, backbone):
    torch.manual_seed(0)
    base, overrides = DETECTORS[detector]
    model = build_detector(tmp_path, base, backbone, overrides)
    attention = [
        m for m in model.backbone.modules()
        if isinstance(m, BACKBONES[backbone])
    ]
    calls = []
    for module in attention:  # observe (not replace) the attention layers
        module.register_forward_hook(
            lambda module, args, output: calls.append(module))
    trainable = {
        n: p.detach().clone()
        for n, p in model.backbone.named_parameters() if p.requires_grad
    }

    model.train()
    optim_wrapper = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    log_vars = model.train_step(
        batch(with_gt=True, with_masks=detector == 'mask_rcnn'), optim_wrapper)
    assert torch.isfinite(log_vars['loss']), log_vars
    # every attention layer ran in the step
    assert {id(m) for m in calls} == {id(m) for m in attention}
    params = dict(model.backbone.named_parameters())
    # the backbone trained
    assert any(not torch.equal(params[n], before)
               for n, before in trainable.items())
    calls.clear()

    model.eval()
    with torch.no_grad():
        results = model.test_step(batch(with_gt=False))
    assert len(results) == len(IMAGE_SHAPES) and len(calls) == len(attention)
    for result, (h, w) in zip(results, IMAGE_SHAPES):
        assert isinstance(result, DetDataSample) and result.ori_shape == (h, w)
        pred = result.pred_instances
        assert pred.bboxes.ndim == 2 and pred.bboxes.shape[1] == 4
        assert len(pred.scores) == len(pred.labels) == len(pred.bboxes)
        assert torch.isfinite(pred.bboxes).all() and torch.isfinite(
            pred.scores).all()
        if detector == 'mask_rcnn':
            assert pred.masks.shape == (len(pred.bboxes), h, w)
