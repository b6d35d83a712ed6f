"""Helpers every layer may import: ConfigError and torch-release compatibility."""
from .errors import ConfigError

__all__ = ['ConfigError']
