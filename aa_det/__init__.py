"""aa_det: Attention Augmented (AA) and Global Self-Attention (GSA) ResNets for MMDetection 3.x.

``import aa_det`` (or ``custom_imports=dict(imports=['aa_det'])`` in a config)
registers the backbones in ``mmdet.registry.MODELS`` and the attention convs as
conv layers, and allow-lists mmengine checkpoint types for torch's safe loading.
"""
from .utils import register_safe_globals
from .version import __version__

register_safe_globals()

from . import classification, models  # noqa: E402,F401  (registration)

__all__ = ['__version__', 'register_safe_globals']
