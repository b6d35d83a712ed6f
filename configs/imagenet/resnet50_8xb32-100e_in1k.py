# ResNet-50 baseline on the AA paper's schedule (8 GPUs x 32 = 256 images), on
# mmpretrain's ResNet-50 recipe with mmdet's ResNet (its keys are the
# detectors' backbone keys).
_base_ = [
    'mmpretrain::_base_/models/resnet50.py',
    'mmpretrain::_base_/datasets/imagenet_bs32.py',
    '../_base_/schedules/imagenet_aa_100e.py',
    '../_base_/classification_runtime.py'
]
model = dict(
    backbone=dict(
        type='mmdet.ResNet',
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        norm_eval=False))
