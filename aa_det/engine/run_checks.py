"""Every check of ``configs/_base_/default_runtime.py`` in one hook, for a
config of one's own.

A config on mmdet's bases has mmdet's ``default_hooks``; ours cannot be added
next to them from a second base (mmengine refuses a key two bases define). One
line does it::

    custom_imports = dict(imports=['aa_det'], allow_failed_imports=False)
    custom_hooks = [dict(type='RunChecksHook')]
"""
from mmdet.registry import HOOKS
from mmengine.hooks import Hook

from .checkpoints import CheckpointCheckHook, SafeCheckpointHook
from .hooks import (DatasetCheckHook, EarlyNumClassCheckHook,
                    HeadNormCheckHook, StopOnNonFiniteLoss,
                    StopOnNonFiniteOutputs)


@HOOKS.register_module()
class RunChecksHook(Hook):
    """The checks our configs run: the checkpoint a run loads and the backbone
    weights nothing loaded (:class:`CheckpointCheckHook`), the classes
    (:class:`EarlyNumClassCheckHook`) and images (:class:`DatasetCheckHook`) of
    every dataset, before training; non-finite losses
    (:class:`StopOnNonFiniteLoss`) and outputs
    (:class:`StopOnNonFiniteOutputs`); the head's shared BatchNorms
    (:class:`HeadNormCheckHook`); checkpoints written with torch's safe types
    (:class:`SafeCheckpointHook`).

    In ``before_run``, the first stage of a run, it registers each of these
    hooks with the Runner at the hook's own priority, so each stage runs them
    where a config naming them would: the ones after this hook (all of them at
    its default priority, ``HIGHEST``) in this same ``before_run``, any placed
    before it at once. The Runner holds them from then on; this hook does
    nothing else.
    """

    priority = 'HIGHEST'

    def __init__(self) -> None:
        self.hooks = [
            CheckpointCheckHook(),
            EarlyNumClassCheckHook(),
            DatasetCheckHook(),
            StopOnNonFiniteLoss(),
            StopOnNonFiniteOutputs(),
            HeadNormCheckHook(),
            SafeCheckpointHook()
        ]

    def before_run(self, runner) -> None:
        new = [
            hook for hook in self.hooks
            if not any(hook is held for held in runner.hooks)
        ]
        for hook in new:
            runner.register_hook(hook)
        position = next(i for i, held in enumerate(runner.hooks)
                        if held is self)
        # a priority above this hook's: missed this stage
        for hook in runner.hooks[:position]:
            if any(hook is each for each in new):
                hook.before_run(runner)
