default_scope = 'mmdet'
custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=3, save_last=True),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    check_loss=dict(type='StopOnNonFiniteLoss', interval=1))  # stops on a NaN / inf loss
env_cfg = dict(cudnn_benchmark=True, mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
               dist_cfg=dict(backend='nccl'))
log_processor = dict(window_size=50, by_epoch=True)
log_level = 'INFO'
load_from = None
resume = False
