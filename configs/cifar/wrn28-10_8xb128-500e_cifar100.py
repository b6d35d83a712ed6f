# Wide-ResNet-28-10 on CIFAR-100, the AA paper's baseline (Table 1; appendix A.1): 500 epochs, SGD
# momentum 0.9, batch 1024 (8 GPUs x 128), lr linearly from 0 to 0.2 * B / 256 = 0.8 over the first
# 5% (25 epochs), then cosine; weight decay 2e-4.
_base_ = ['../_base_/datasets/cifar100.py', '../_base_/classification_runtime.py']
model = dict(
    type='ImageClassifier',
    num_classes=100,
    data_preprocessor=dict(type='ImgDataPreprocessor', mean=[129.3, 124.1, 112.4], std=[68.2, 65.4, 70.4]),
    backbone=dict(type='WideResNet', depth=28, widen_factor=10, num_stages=3,
                  norm_cfg=dict(type='SyncBN', requires_grad=True)))
max_epochs = 500
warmup_epochs = 25
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=10)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.8, momentum=0.9, weight_decay=2e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=warmup_epochs, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=warmup_epochs, end=max_epochs,
         T_max=max_epochs - warmup_epochs, convert_to_iter_based=True)
]
auto_scale_lr = dict(enable=False, base_batch_size=1024)
