# mmdet's runtime, plus the import that registers AAResNet / GSAResNet (their
# attention convs, and the hooks below) for any entry point, mmdet's own
# tools/train.py and tools/test.py included.
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
default_hooks = dict(
    checkpoint=dict(max_keep_ckpts=3),  # 150 epochs: keep the newest three
    # mmdet's CheckInvalidLossHook at every iteration, stopping with one clear
    # line
    check_loss=dict(type='StopOnNonFiniteLoss', interval=1),
    # validation / testing end with one clear line on NaN or inf features or
    # predictions
    check_outputs=dict(type='StopOnNonFiniteOutputs'),
    # mmdet's NumClassCheckHook (also the validation set before training, and
    # the test set), one line
    check_classes=dict(type='EarlyNumClassCheckHook'),
    # the checkpoint a run loads or resumes checked first, one line for a file
    # that does not fit
    check_checkpoint=dict(type='CheckpointCheckHook'),
    # checkpoints written with torch's safe types: every mmdet / mmengine
    # loader reads them on torch >= 2.6
    safe_checkpoint=dict(type='SafeCheckpointHook'),
    # a warning when a dense head shares its BatchNorms across FPN levels
    check_head_norms=dict(type='HeadNormCheckHook'))
