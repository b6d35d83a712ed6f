"""Every check of ``configs/_base_/default_runtime.py`` in one hook, for a config of one's own.

A config on mmdet's bases has mmdet's ``default_hooks``; ours cannot be added next to them from a second
base (mmengine refuses a key two bases define). One line does it::

    custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
    custom_hooks = [dict(type='RunChecksHook')]
"""
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.runner import get_priority

from .checkpoints import CheckpointCheckHook, SafeCheckpointHook
from .hooks import (DatasetCheckHook, EarlyNumClassCheckHook, HeadNormCheckHook, StopOnNonFiniteLoss,
                    StopOnNonFiniteOutputs)


def _run_each(stage: str):
    """A hook method running ``stage`` of each of ``self.hooks``."""
    def run(self, runner, *args, **kwargs):
        for hook in self.hooks:
            getattr(hook, stage)(runner, *args, **kwargs)
    run.__name__ = stage
    return run


@HOOKS.register_module()
class RunChecksHook(Hook):
    """The checks our configs run, in the order of their own priorities: the checkpoint a run loads
    (:class:`CheckpointCheckHook`), the classes (:class:`EarlyNumClassCheckHook`) and images
    (:class:`DatasetCheckHook`) of every dataset, before training; non-finite losses
    (:class:`StopOnNonFiniteLoss`) and outputs (:class:`StopOnNonFiniteOutputs`); the head's shared
    BatchNorms (:class:`HeadNormCheckHook`); checkpoints written with torch's safe types
    (:class:`SafeCheckpointHook`). Each stage of this hook runs each hook's stage in turn."""

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        hooks = [CheckpointCheckHook(), EarlyNumClassCheckHook(), DatasetCheckHook(), StopOnNonFiniteLoss(),
                 StopOnNonFiniteOutputs(), HeadNormCheckHook(), SafeCheckpointHook()]
        self.hooks = sorted(hooks, key=lambda hook: get_priority(hook.priority))


for _stage in Hook.stages:
    setattr(RunChecksHook, _stage, _run_each(_stage))
