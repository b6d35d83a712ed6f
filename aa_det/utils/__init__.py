from .safe_load import register_safe_globals

__all__ = ['register_safe_globals']
