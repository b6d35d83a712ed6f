# The demo (README main job): RetinaNet + FPN with an AA-ResNet-18 trained from
# scratch on the generated shapes dataset, on 2 CPU cores in a few minutes.
# Narrow widths keep it fast; everything else is the COCO recipe's (from
# scratch, jitter, flips, warm-up, clipping).
_base_ = [
    '../_base_/models/retinanet_r50_fpn_scratch.py',
    '../_base_/datasets/shapes_demo.py',
    '../_base_/default_runtime.py',
]
# BN in a single process (mmengine's Runner)
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(
        _delete_=True,
        type='AAResNet',
        depth=18,
        base_channels=32,
        frozen_stages=-1,
        norm_cfg=norm_cfg,
        norm_eval=False,
        attention=dict(num_heads=4, min_key_dim_per_head=8),
        init_cfg=None),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=64),
    bbox_head=dict(
        num_classes=3,
        in_channels=64,
        feat_channels=64,
        stacked_convs=2,
        anchor_generator=dict(octave_base_scale=2)))

max_epochs = 12
train_cfg = dict(
    type="EpochBasedTrainLoop", max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[9, 11],
        gamma=0.1)
]
optim_wrapper = dict(
    type='OptimWrapper',
    # one param group per distinct setting
    constructor='MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001),
    # shared head convs
    paramwise_cfg=dict(
        norm_decay_mult=0.0, bias_decay_mult=0.0, bypass_duplicate=True),
    clip_grad=dict(max_norm=35, norm_type=2))
auto_scale_lr = dict(enable=False, base_batch_size=8)
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=4))
log_processor = dict(window_size=10)
