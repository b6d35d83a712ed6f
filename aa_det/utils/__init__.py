from .safe_load import mmengine_checkpoint_globals, mmengine_safe_globals, register_checkpoint_loader

__all__ = ['mmengine_checkpoint_globals', 'mmengine_safe_globals', 'register_checkpoint_loader']
