# Classification demo on generated shapes (aa_det.datasets.generate_shapes_folder writes
# data/shapes_cls/): a narrow AA-ResNet-18 from scratch, under a minute on 2 CPU cores. Its
# backbone is the detection demo's, so its checkpoint initialises
# configs/retinanet/retinanet_aa-r18-shapes-cls-pre_fpn_1xb8-ms-12e_shapes.py.
_base_ = ['../_base_/models/classifier_r50.py', '../_base_/classification_runtime.py']
data_root = 'data/shapes_cls/'
model = dict(
    num_classes=3,
    backbone=dict(_delete_=True, type='AAResNet', depth=18, base_channels=32,
                  norm_cfg=dict(type='SyncBN', requires_grad=True), norm_eval=False, init_cfg=None,
                  attention=dict(num_heads=4, min_key_dim_per_head=8)))
dataset = dict(type='ImageNetFolder', crop_size=64, resize_size=64, crop_scale=(0.5, 1.0))
train_dataloader = dict(batch_size=32, num_workers=1, persistent_workers=True,
                        sampler=dict(type='DefaultSampler', shuffle=True),
                        dataset=dict(dataset, data_root=data_root + 'train', train=True))
val_dataloader = dict(batch_size=64, num_workers=1, persistent_workers=True,
                      sampler=dict(type='DefaultSampler', shuffle=False),
                      dataset=dict(dataset, data_root=data_root + 'val', train=False))
test_dataloader = val_dataloader
val_evaluator = dict(type='TopKAccuracy', topk=(1,))
test_evaluator = val_evaluator
max_epochs = 10
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4),
                     clip_grad=dict(max_norm=10))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs, T_max=max_epochs)
]
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=5))
