"""Run pieces a config names, registered in mmdet's and mmengine's registries: the hooks that check a run
(``StopOnNonFiniteLoss``, ``StopOnNonFiniteOutputs``, ``NumClassesCheckHook``, ``HeadNormCheckHook``,
``CheckpointCheckHook``), the ``torch.compile`` hooks (``CompileBackboneHook``, ``EagerDataPreprocessorHook``,
``StaticModuleIntsHook``), ``CPUAmpOptimWrapper``, ``MergedGroupsOptimWrapperConstructor`` and
``CompileOptimWrapperConstructor``."""
from ..utils.errors import ConfigError
from .checkpoints import CheckpointCheckHook
from .hooks import (CompileBackboneHook, EagerDataPreprocessorHook, HeadNormCheckHook, NonFiniteLossError,
                    NonFiniteOutputError, NumClassesCheckHook, StaticModuleIntsHook, StopOnNonFiniteLoss,
                    StopOnNonFiniteOutputs)
from .optim_wrapper import CPUAmpOptimWrapper, CompileOptimWrapperConstructor, MergedGroupsOptimWrapperConstructor

__all__ = ['CPUAmpOptimWrapper', 'CheckpointCheckHook', 'CompileBackboneHook', 'CompileOptimWrapperConstructor',
           'ConfigError', 'EagerDataPreprocessorHook', 'HeadNormCheckHook', 'MergedGroupsOptimWrapperConstructor',
           'NonFiniteLossError', 'NonFiniteOutputError', 'NumClassesCheckHook', 'StaticModuleIntsHook',
           'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs']
