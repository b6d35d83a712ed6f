# GSA paper Sec. 4: 90 epochs, SGD momentum 0.9, cosine schedule, base lr 0.1 at batch 2048,
# weight decay 1e-4 (label smoothing 0.1 is set on the model).
max_epochs = 90
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=5)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4))
param_scheduler = [dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs, T_max=max_epochs)]
auto_scale_lr = dict(enable=False, base_batch_size=2048)
