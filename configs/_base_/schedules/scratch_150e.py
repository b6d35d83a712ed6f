# From-scratch RetinaNet schedule (AA paper Sec. 4.4 follows the TF TPU
# RetinaNet recipe): 150 epochs, total batch 64, SGD, linear warm-up, step
# decay at epochs 120 and 140, gradient clipping (from-scratch training
# diverges without it), no weight decay on norms.
max_epochs = 150
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=10)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
        end=2000),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[120, 140],
        gamma=0.1)
]

optim_wrapper = dict(
    type='OptimWrapper',
    # one param group per distinct setting, not per parameter: SGD's kernels
    # run per group
    constructor='MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.04, momentum=0.9, weight_decay=0.0001),
    # bypass_duplicate: RetinaSepBNHead's convs are shared by the FPN levels
    # (one parameter, several modules); mmengine's constructor refuses a
    # parameter seen twice without it
    paramwise_cfg=dict(
        norm_decay_mult=0.0, bias_decay_mult=0.0, bypass_duplicate=True),
    clip_grad=dict(max_norm=35, norm_type=2))

# lr 0.04 is for a total batch of 64 (mmdet RetinaNet's 0.01 per 16 images,
# linearly scaled). `tools/train.py --auto-scale-lr` rescales it to the real
# total batch.
auto_scale_lr = dict(enable=False, base_batch_size=64)
