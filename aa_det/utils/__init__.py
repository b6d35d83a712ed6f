"""Helpers every layer may import: the errors of our checks and torch-release
compatibility."""
from .errors import ConfigError, RunError

__all__ = ['ConfigError', 'RunError']
