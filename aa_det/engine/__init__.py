"""Run pieces a config names, registered in mmdet's and mmengine's registries: the hooks that check a run
(``StopOnNonFiniteLoss``, ``StopOnNonFiniteOutputs``, ``NumClassesCheckHook``, ``HeadNormCheckHook``,
``CheckpointCheckHook``), ``CompileBackboneHook`` and ``MergedGroupsOptimWrapperConstructor``."""
from ..utils.errors import ConfigError
from .checkpoints import CheckpointCheckHook
from .hooks import (CompileBackboneHook, HeadNormCheckHook, NonFiniteLossError, NonFiniteOutputError,
                    NumClassesCheckHook, StopOnNonFiniteLoss, StopOnNonFiniteOutputs)
from .optim_wrapper import MergedGroupsOptimWrapperConstructor

__all__ = ['CheckpointCheckHook', 'CompileBackboneHook', 'ConfigError', 'HeadNormCheckHook',
           'MergedGroupsOptimWrapperConstructor', 'NonFiniteLossError', 'NonFiniteOutputError',
           'NumClassesCheckHook', 'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs']
