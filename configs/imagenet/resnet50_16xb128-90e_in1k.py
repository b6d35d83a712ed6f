# ResNet-50 baseline on the GSA paper's schedule (GSA Table 6): 16 GPUs x 128 =
# 2048 images, 90 epochs, cosine, label smoothing 0.1 (mmpretrain's
# LabelSmoothLoss).
_base_ = [
    'mmpretrain::_base_/models/resnet50_label_smooth.py',
    'mmpretrain::_base_/datasets/imagenet_bs32.py',
    '../_base_/schedules/imagenet_gsa_90e.py',
    '../_base_/classification_runtime.py'
]
model = dict(
    backbone=dict(
        type='mmdet.ResNet',
        depth=50,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        norm_eval=False))
train_dataloader = dict(batch_size=128)
