"""Training-loop pieces: config loading and Runner construction for the tools (checkpoints
checked before the run), the ``CPUAmpOptimWrapper`` and ``PlainGroupsOptimWrapperConstructor``
registered in mmengine's registries, and the ``StopOnNonFiniteLoss`` and ``CompileBackboneHook``
hooks."""
from .errors import ConfigError
from .hooks import CompileBackboneHook, NonFiniteLossError, StopOnNonFiniteLoss
from .optim_wrapper import CPUAmpOptimWrapper, PlainGroupsOptimWrapperConstructor
from .runner import build_runner, check_coco_annotation, load_config

__all__ = ['CPUAmpOptimWrapper', 'CompileBackboneHook', 'ConfigError', 'NonFiniteLossError',
           'PlainGroupsOptimWrapperConstructor', 'StopOnNonFiniteLoss',
           'build_runner', 'check_coco_annotation', 'load_config']
