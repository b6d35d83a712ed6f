"""Training-loop pieces: config loading and Runner construction for the tools, and the
``CPUAmpOptimWrapper`` registered in mmengine's registries."""
from .optim_wrapper import CPUAmpOptimWrapper
from .runner import ConfigError, build_runner, check_coco_annotation, load_config

__all__ = ['CPUAmpOptimWrapper', 'ConfigError', 'build_runner', 'check_coco_annotation', 'load_config']
