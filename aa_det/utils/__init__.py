"""Helpers every layer may import: ConfigError, torch-release compatibility and mmengine checkpoints under
torch's safe loading."""
from .errors import ConfigError
from .safe_load import mmengine_checkpoint_globals, mmengine_safe_globals

__all__ = ['ConfigError', 'mmengine_checkpoint_globals', 'mmengine_safe_globals']
