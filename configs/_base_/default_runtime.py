# mmdet's runtime, plus the import that registers AAResNet / GSAResNet (and their attention
# convs) for any entry point, mmdet's own tools/train.py included.
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
default_hooks = dict(
    checkpoint=dict(max_keep_ckpts=3),  # 150 epochs: keep the newest three
    # mmdet's CheckInvalidLossHook at every iteration, stopping with one clear line
    check_loss=dict(type='StopOnNonFiniteLoss', interval=1),
    # validation / testing end with one clear line on NaN or inf features or predictions
    check_outputs=dict(type='StopOnNonFiniteOutputs'))
