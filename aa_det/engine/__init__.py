"""Run pieces a config names, registered in mmdet's and mmengine's registries: the hooks that check a run
(``StopOnNonFiniteLoss``, ``StopOnNonFiniteOutputs``, ``EarlyNumClassCheckHook``, ``DatasetCheckHook``,
``HeadNormCheckHook``, ``CheckpointCheckHook``), ``SafeCheckpointHook`` (checkpoints torch's safe loading
reads), ``RunChecksHook`` (all of them, for a config of one's own), ``CompileBackboneHook`` and
``MergedGroupsOptimWrapperConstructor`` and ``CPUAmpOptimWrapper``."""
from ..utils.errors import ConfigError, RunError
from .checkpoints import CheckpointCheckHook, SafeCheckpointHook
from .hooks import (CompileBackboneHook, DatasetCheckHook, EarlyNumClassCheckHook, HeadNormCheckHook,
                    NonFiniteLossError, NonFiniteOutputError, StopOnNonFiniteLoss, StopOnNonFiniteOutputs)
from .optim_wrapper import CPUAmpOptimWrapper, MergedGroupsOptimWrapperConstructor
from .run_checks import RunChecksHook

__all__ = ['CheckpointCheckHook', 'CompileBackboneHook', 'ConfigError', 'CPUAmpOptimWrapper', 'DatasetCheckHook', 'EarlyNumClassCheckHook',
           'HeadNormCheckHook', 'MergedGroupsOptimWrapperConstructor', 'NonFiniteLossError', 'NonFiniteOutputError',
           'RunChecksHook', 'RunError', 'SafeCheckpointHook', 'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs']
