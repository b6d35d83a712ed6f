"""Training-loop pieces: config loading and Runner construction for the tools (checkpoints
checked before the run), the ``CPUAmpOptimWrapper`` and ``CompileOptimWrapperConstructor``
registered in mmengine's registries, and the ``StopOnNonFiniteLoss``, ``StopOnNonFiniteOutputs``,
``CompileBackboneHook``, ``EagerDataPreprocessorHook`` and ``StaticModuleIntsHook`` hooks."""
from .errors import ConfigError
from .hooks import (CompileBackboneHook, EagerDataPreprocessorHook, NonFiniteLossError, NonFiniteOutputError,
                    StaticModuleIntsHook, StopOnNonFiniteLoss, StopOnNonFiniteOutputs)
from .optim_wrapper import CPUAmpOptimWrapper, CompileOptimWrapperConstructor
from .runner import build_runner, check_coco_annotation, load_config

__all__ = ['CPUAmpOptimWrapper', 'CompileBackboneHook', 'CompileOptimWrapperConstructor', 'ConfigError',
           'EagerDataPreprocessorHook', 'NonFiniteLossError', 'NonFiniteOutputError', 'StaticModuleIntsHook',
           'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs',
           'build_runner', 'check_coco_annotation', 'load_config']
