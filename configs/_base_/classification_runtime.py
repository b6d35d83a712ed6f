# mmpretrain's runtime (default_scope='mmpretrain'), plus the import that registers AAResNet /
# GSAResNet / WideResNet (in mmdet's registry: configs name them 'mmdet.AAResNet', ...) for any
# entry point, mmpretrain's own tools/train.py included.
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
default_hooks = dict(
    checkpoint=dict(max_keep_ckpts=3, save_last=True),  # 100-500 epochs: keep the newest three
    # mmdet's CheckInvalidLossHook at every iteration, stopping with one clear line
    check_loss=dict(type='mmdet.StopOnNonFiniteLoss', interval=1),
    # checkpoints loaded with torch's safe loading; the one a run loads or resumes checked first
    check_checkpoint=dict(type='mmdet.CheckpointCheckHook'))
env_cfg = dict(cudnn_benchmark=True)
log_processor = dict(by_epoch=True)
