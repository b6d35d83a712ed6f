# AA paper appendix A.1 on mmpretrain's ImageNet schedule for batch 256: 100
# epochs, SGD momentum 0.9, lr 0.128 per 256 images, linear warm-up over the
# first 5% (5 epochs), divided by 10 at epochs 30, 60, 80 and 90, weight decay
# 1e-4.
_base_ = 'mmpretrain::_base_/schedules/imagenet_bs256.py'
max_epochs = 100
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.128, momentum=0.9, weight_decay=1e-4))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-3,
        by_epoch=True,
        begin=0,
        end=5,
        convert_to_iter_based=True),
    dict(
        type='MultiStepLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        milestones=[30, 60, 80, 90],
        gamma=0.1)
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=5)
auto_scale_lr = dict(enable=False, base_batch_size=256)
