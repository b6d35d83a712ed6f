"""Safe loading of mmengine checkpoints on torch >= 2.6, scoped to the loads that ask for it.

torch.load defaults to ``weights_only=True``, where mmengine 0.10.7's Runner checkpoints (a MessageHub
state with ``HistoryBuffer`` objects and numpy arrays / scalars) fail with ``Unsupported global:
...HistoryBuffer``. :func:`mmengine_checkpoint_globals` keeps the safe unpickler and allows exactly
those types; :class:`aa_det.engine.CheckpointCheckHook` loads inside it for the duration of a run.
"""
import numpy as np

from .compat import safe_globals


def mmengine_safe_globals():
    """What ``torch.serialization.get_unsafe_globals_in_checkpoint`` reports for checkpoints real Runners
    wrote: ``HistoryBuffer``, ``getattr`` (it pickles its statistics methods as ``getattr(HistoryBuffer,
    'min')``), numpy arrays, dtypes (float64, int64) and scalars. numpy's ``_reconstruct`` and ``scalar``
    are allowed under numpy 1's and numpy 2's names, so that a checkpoint of the torch 2.1 stack
    (numpy 1) resumes on the pinned one; they are ``(function, name)`` pairs in the list."""
    from mmengine.logging.history_buffer import HistoryBuffer
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    numpy_names = [(f, f'numpy.{core}.multiarray.{f.__name__}') for f in (_reconstruct, scalar)
                   for core in ('core', '_core')]
    return [HistoryBuffer, getattr, np.ndarray, np.dtype, type(np.dtype(np.float64)),
            type(np.dtype(np.int64))] + numpy_names


def mmengine_checkpoint_globals():
    """A context in which ``torch.load(weights_only=True)`` accepts mmengine checkpoints (a no-op on
    torch < 2.6, which loads everything).

    Examples:
        >>> import torch
        >>> from mmengine.logging.history_buffer import HistoryBuffer
        >>> from aa_det.utils.compat import TORCH_VERSION
        >>> allowed = lambda: HistoryBuffer in torch.serialization.get_safe_globals()
        >>> with mmengine_checkpoint_globals():
        ...     TORCH_VERSION < (2, 6) or allowed()
        True
        >>> TORCH_VERSION < (2, 6) or not allowed()
        True
    """
    return safe_globals(mmengine_safe_globals())
