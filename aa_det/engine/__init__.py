"""Training-loop pieces: config loading and Runner construction for the tools (data, model and checkpoints
checked before the run: ``checks.py``, ``checkpoints.py``), the end of a distributed run, the ``CPUAmpOptimWrapper``,
``MergedGroupsOptimWrapperConstructor`` and ``CompileOptimWrapperConstructor`` registered in mmengine's
registries, and the ``StopOnNonFiniteLoss``, ``StopOnNonFiniteOutputs``, ``CompileBackboneHook``,
``EagerDataPreprocessorHook`` and ``StaticModuleIntsHook`` hooks."""
from ..utils.errors import ConfigError
from .checks import check_classification_data, check_coco_annotation, check_run_config
from .hooks import (CompileBackboneHook, EagerDataPreprocessorHook, NonFiniteLossError, NonFiniteOutputError,
                    StaticModuleIntsHook, StopOnNonFiniteLoss, StopOnNonFiniteOutputs)
from .optim_wrapper import CPUAmpOptimWrapper, CompileOptimWrapperConstructor, MergedGroupsOptimWrapperConstructor
from .runner import build_runner, close_process_group, load_config

__all__ = ['CPUAmpOptimWrapper', 'CompileBackboneHook', 'CompileOptimWrapperConstructor', 'ConfigError',
           'EagerDataPreprocessorHook', 'MergedGroupsOptimWrapperConstructor', 'NonFiniteLossError',
           'NonFiniteOutputError', 'StaticModuleIntsHook', 'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs',
           'build_runner', 'check_classification_data', 'check_coco_annotation', 'check_run_config',
           'close_process_group', 'load_config']
