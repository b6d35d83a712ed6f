"""aa_det: Attention Augmented (AA) and Global Self-Attention (GSA) ResNets for
MMDetection 3.x.

``import aa_det`` (or ``custom_imports=dict(imports=['aa_det'])`` in a config)
registers the backbones in ``mmdet.registry.MODELS`` and the attention convs as
conv layers, and the loss, dataset, metric, hooks and optimizer wrappers our
configs name; it changes no other library's behaviour.
"""
# (registration)
from . import datasets, engine, evaluation, models  # noqa: F401
from .version import __version__

__all__ = ['__version__']
