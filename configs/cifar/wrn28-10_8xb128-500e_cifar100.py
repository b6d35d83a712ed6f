# Wide-ResNet-28-10 on CIFAR-100, the AA paper's baseline (Table 1; appendix
# A.1), on mmpretrain's CIFAR-100 data (4-pixel padded random 32x32 crops +
# flips) and classifier: 500 epochs, SGD momentum 0.9, batch 1024 (8 GPUs x
# 128), lr linearly from 0 to 0.2 * B / 256 = 0.8 over the first 5% (25
# epochs), then cosine; weight decay 2e-4.
_base_ = [
    'mmpretrain::_base_/models/resnet50_cifar.py',
    'mmpretrain::_base_/datasets/cifar100_bs16.py',
    'mmpretrain::_base_/schedules/cifar10_bs128.py',
    '../_base_/classification_runtime.py'
]
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmdet.WideResNet',
        depth=28,
        widen_factor=10,
        num_stages=3,
        out_indices=(2, ),
        norm_cfg=dict(type='SyncBN', requires_grad=True)),
    head=dict(num_classes=100, in_channels=640, topk=(1, 5)))
# the python version unpacked in data/cifar100/cifar-100-python/; nothing is
# downloaded
train_dataloader = dict(
    batch_size=128, num_workers=4, dataset=dict(download=False))
val_dataloader = dict(
    batch_size=256, num_workers=4, dataset=dict(download=False))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_evaluator = val_evaluator
max_epochs = 500
warmup_epochs = 25
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=10)
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.8, momentum=0.9, weight_decay=2e-4))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-3,
        by_epoch=True,
        begin=0,
        end=warmup_epochs,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=warmup_epochs,
        end=max_epochs,
        T_max=max_epochs - warmup_epochs,
        convert_to_iter_based=True)
]
auto_scale_lr = dict(enable=False, base_batch_size=1024)
