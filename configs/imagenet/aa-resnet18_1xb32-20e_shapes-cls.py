# Classification demo on generated shapes (demo/synthetic_shapes.py
# generate_shapes_folder writes data/shapes_cls/{train,val}/<class>/*.png,
# mmpretrain's folder layout): a narrow AA-ResNet-18 from scratch, about 30 s
# on 2 CPU cores. Its backbone is the detection demo's, so its checkpoint
# initialises
# configs/retinanet/retinanet_aa-r18-shapes-cls-pre_fpn_1xb8-ms-12e_shapes.py.
_base_ = [
    'mmpretrain::_base_/models/resnet18.py',
    '../_base_/classification_runtime.py'
]
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmdet.AAResNet',
        depth=18,
        base_channels=32,
        out_indices=(3, ),
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        norm_eval=False,
        attention=dict(num_heads=4, min_key_dim_per_head=8)),
    head=dict(num_classes=3, in_channels=256, topk=(1, )))
data_preprocessor = dict(
    num_classes=3,
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True)
data_root = 'data/shapes_cls/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.5, 1.0)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=64, edge='short'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=32,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix='train',
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=1,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix='val',
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator
max_epochs = 20
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict()
test_cfg = dict()
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4),
    clip_grad=dict(max_norm=10))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=0.01,
        by_epoch=True,
        begin=0,
        end=1,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs)
]
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=5))
