# mmpretrain's runtime (default_scope='mmpretrain'), plus the import that
# registers AAResNet / GSAResNet / WideResNet (in mmdet's registry: configs
# name them 'mmdet.AAResNet', ...) for any entry point, mmpretrain's own
# tools/train.py included.
_base_ = 'mmpretrain::_base_/default_runtime.py'
custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
default_hooks = dict(
    # 100-500 epochs: keep the newest three
    checkpoint=dict(max_keep_ckpts=3, save_last=True),
    # mmdet's CheckInvalidLossHook at every iteration, stopping with one clear
    # line
    check_loss=dict(type='mmdet.StopOnNonFiniteLoss', interval=1),
    # the checkpoint a run loads or resumes checked first, one line for a file
    # that does not fit
    check_checkpoint=dict(type='mmdet.CheckpointCheckHook'),
    # checkpoints written with torch's safe types: mmpretrain's init_model
    # reads them on torch >= 2.6
    safe_checkpoint=dict(type='mmdet.SafeCheckpointHook'))
env_cfg = dict(cudnn_benchmark=True)
log_processor = dict(by_epoch=True)
