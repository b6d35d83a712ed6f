from .runner import ConfigError, build_runner, check_coco_annotation, load_config

__all__ = ['ConfigError', 'build_runner', 'check_coco_annotation', 'load_config']
