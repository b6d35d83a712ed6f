"""aa_det: Attention Augmented (AA) and Global Self-Attention (GSA) ResNets for MMDetection 3.x.

``import aa_det`` (or ``custom_imports=dict(imports=['aa_det'])`` in a config)
registers the backbones in ``mmdet.registry.MODELS`` and the attention convs as
conv layers, ``CPUAmpOptimWrapper`` (``--amp`` on the CPU) and
``LenientCocoMetric`` (COCO files without ``info``), and makes mmengine's
checkpoint loader accept mmengine checkpoints under torch's safe loading.
"""
from .utils import register_checkpoint_loader
from .version import __version__

register_checkpoint_loader()

from . import datasets, engine, evaluation, models  # noqa: E402,F401  (registration)

__all__ = ['__version__', 'register_checkpoint_loader']
