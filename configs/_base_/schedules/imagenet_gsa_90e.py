# GSA paper Sec. 4 on mmpretrain's cosine ImageNet schedule for batch 2048: 90
# epochs, SGD momentum 0.9 (no Nesterov, no warm-up), cosine from lr 0.1 at
# batch 2048, weight decay 1e-4 (label smoothing 0.1 is the head's loss).
_base_ = 'mmpretrain::_base_/schedules/imagenet_bs2048_coslr.py'
max_epochs = 90
optim_wrapper = dict(
    optimizer=dict(
        type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=False))
param_scheduler = [
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs)
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=5)
auto_scale_lr = dict(enable=False, base_batch_size=2048)
