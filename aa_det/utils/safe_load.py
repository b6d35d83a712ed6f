"""Safe loading of mmengine checkpoints on torch >= 2.6, scoped to the loads that ask for it.

torch.load defaults to ``weights_only=True``; mmengine 0.10.7 Runner checkpoints
hold a MessageHub state with ``HistoryBuffer`` objects and numpy arrays /
scalars, so ``--resume`` and ``load_from`` fail with
``Unsupported global: ...HistoryBuffer``. We keep the safe unpickler and
allow-list exactly those types inside :func:`mmengine_checkpoint_globals`:
:class:`aa_det.engine.CheckpointCheckHook` (named by ``configs/_base_/default_runtime.py``)
loads inside it for the duration of a run. A ``torch.load`` elsewhere keeps torch's own allow-list.
"""
import numpy as np

from .compat import safe_globals


def mmengine_safe_globals():
    """The types an mmengine Runner checkpoint holds beyond tensors and containers.

    What ``torch.serialization.get_unsafe_globals_in_checkpoint`` reports for
    checkpoints real Runners wrote (a toy model; the demo RetinaNet with
    ``--amp`` and validation; numpy 2): ``HistoryBuffer``, ``getattr``,
    ``numpy.ndarray``, ``numpy.dtype``, ``_reconstruct`` and ``scalar``, plus
    the dtype classes the unpickler rebuilds: float64 (the buffers' values,
    the ETA scalar) and int64 (the buffers' counts). ``HistoryBuffer`` pickles
    its statistics methods as ``getattr(HistoryBuffer, 'min')``, hence
    ``getattr``; what it returns still cannot be called by the safe unpickler
    unless that callable is itself allow-listed.

    numpy 2 pickles ``_reconstruct`` and ``scalar`` as ``numpy._core.multiarray.*``,
    numpy 1 as ``numpy.core.multiarray.*``: both names are allowed, so that a
    checkpoint written on the torch 2.1 stack (numpy 1) resumes on the pinned one.

    Returns:
        list: The classes and functions to allow-list, and ``(function, name)``
        pairs for the numpy functions under both of their pickled names.
    """
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
    """A context in which ``torch.load(weights_only=True)`` accepts mmengine checkpoints.

    For code that calls ``torch.load`` on a Runner checkpoint itself instead of
    through mmengine's ``CheckpointLoader``. On torch < 2.6 (``weights_only``
    defaults to False there) it does nothing.

    Examples:
        >>> import torch
        >>> from mmengine.logging.history_buffer import HistoryBuffer
        >>> from aa_det.utils.compat import TORCH_VERSION
        >>> allowed = lambda: HistoryBuffer in torch.serialization.get_safe_globals()
        >>> with mmengine_checkpoint_globals():  # torch < 2.6 loads everything
        ...     TORCH_VERSION < (2, 6) or allowed()
        True
        >>> TORCH_VERSION < (2, 6) or not allowed()
        True
    """
    return safe_globals(mmengine_safe_globals())
