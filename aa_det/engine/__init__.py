"""Training-loop pieces: config loading and Runner construction for the tools (checkpoints
checked before the run), the ``CPUAmpOptimWrapper`` and ``CompileOptimWrapperConstructor``
registered in mmengine's registries, and the ``StopOnNonFiniteLoss``, ``CompileBackboneHook``,
``EagerDataPreprocessorHook`` and ``StaticModuleIntsHook`` hooks."""
from .errors import ConfigError
from .hooks import (CompileBackboneHook, EagerDataPreprocessorHook, NonFiniteLossError, StaticModuleIntsHook,
                    StopOnNonFiniteLoss)
from .optim_wrapper import CPUAmpOptimWrapper, CompileOptimWrapperConstructor
from .runner import build_runner, check_coco_annotation, load_config

__all__ = ['CPUAmpOptimWrapper', 'CompileBackboneHook', 'CompileOptimWrapperConstructor', 'ConfigError',
           'EagerDataPreprocessorHook', 'NonFiniteLossError', 'StaticModuleIntsHook', 'StopOnNonFiniteLoss',
           'build_runner', 'check_coco_annotation', 'load_config']
