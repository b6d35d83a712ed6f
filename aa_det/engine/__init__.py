"""Run pieces a config names, registered in mmdet's and mmengine's registries:
the hooks that check a run (``StopOnNonFiniteLoss``,
``StopOnNonFiniteOutputs``, ``EarlyNumClassCheckHook``, ``DatasetCheckHook``,
``HeadNormCheckHook``, ``CheckpointCheckHook``), ``SafeCheckpointHook``
(checkpoints torch's safe loading reads), ``RunChecksHook`` (all of them, for a
config of one's own), ``CompileBackboneHook``,
``MergedGroupsOptimWrapperConstructor``, ``CPUAmpOptimWrapper`` (what ``--amp``
sets on a CPU), and ``CompileOptimWrapperConstructor``,
``EagerDataPreprocessorHook``, ``StaticModuleIntsHook`` (what our tools set
where a config sets mmengine's ``compile``): every type a config our tools dump
names."""
from ..utils.errors import ConfigError, RunError
from .checkpoints import CheckpointCheckHook, SafeCheckpointHook
from .hooks import (CompileBackboneHook, DatasetCheckHook,
                    EagerDataPreprocessorHook, EarlyNumClassCheckHook,
                    HeadNormCheckHook, NonFiniteLossError,
                    NonFiniteOutputError, StaticModuleIntsHook,
                    StopOnNonFiniteLoss, StopOnNonFiniteOutputs)
from .optim_wrapper import (CompileOptimWrapperConstructor, CPUAmpOptimWrapper,
                            MergedGroupsOptimWrapperConstructor)
from .run_checks import RunChecksHook

__all__ = [
    'CheckpointCheckHook', 'CompileBackboneHook',
    'CompileOptimWrapperConstructor', 'ConfigError', 'CPUAmpOptimWrapper',
    'DatasetCheckHook', 'EagerDataPreprocessorHook', 'EarlyNumClassCheckHook',
    'HeadNormCheckHook', 'MergedGroupsOptimWrapperConstructor',
    'NonFiniteLossError', 'NonFiniteOutputError', 'RunChecksHook', 'RunError',
    'SafeCheckpointHook', 'StaticModuleIntsHook', 'StopOnNonFiniteLoss',
    'StopOnNonFiniteOutputs'
]
