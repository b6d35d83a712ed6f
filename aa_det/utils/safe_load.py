"""Safe checkpoint loading for mmengine checkpoints on torch >= 2.6.

torch.load defaults to ``weights_only=True``; mmengine 0.10.7 checkpoints hold a
MessageHub state with ``HistoryBuffer`` objects and numpy arrays / scalars, so
``--resume`` and ``load_from`` fail with ``Unsupported global: ...HistoryBuffer``.
We keep the safe unpickler and allow-list exactly those types.
"""
import numpy as np
import torch


def _numpy_globals():
    """numpy types that pickled arrays and scalars reference (numpy 1.x and 2.x)."""
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtypes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.float16, np.int64, np.int32,
                                           np.int8, np.uint8, np.bool_)]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtypes]


def mmengine_safe_globals():
    """The types an mmengine Runner checkpoint holds beyond tensors and containers.

    ``HistoryBuffer`` pickles its statistics methods as ``getattr(HistoryBuffer, 'min')``,
    so ``getattr`` is needed too; what it returns still cannot be called by the safe
    unpickler unless that callable is itself allow-listed.
    """
    from mmengine.logging.history_buffer import HistoryBuffer
    return [HistoryBuffer, getattr, *_numpy_globals()]


def register_safe_globals():
    """Allow-list mmengine checkpoint types for ``torch.load(weights_only=True)``."""
    add = getattr(torch.serialization, 'add_safe_globals', None)
    if add is not None:  # torch < 2.4 loads these with weights_only=False anyway
        add(mmengine_safe_globals())
