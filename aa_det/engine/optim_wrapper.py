"""Mixed precision training on the CPU: bf16 autocast in mmengine's optimizer wrapper.

mmengine 0.10.7's ``AmpOptimWrapper`` asserts a GPU (CUDA, NPU, MLU or MUSA), so
``tools/train.py --amp`` on a CPU machine stopped with an ``AssertionError``;
:func:`aa_det.engine.load_config` chooses :class:`CPUAmpOptimWrapper` there instead.
"""
from contextlib import contextmanager

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """An :class:`OptimWrapper` whose forward runs under CPU bf16 autocast.

    The CPU counterpart of mmengine's ``AmpOptimWrapper``: the model's forward
    (data preprocessing and losses included, as ``BaseModel.train_step`` runs
    them inside :meth:`optim_context`) runs in
    ``torch.autocast('cpu', dtype=torch.bfloat16)``; parameters, gradients and
    the optimizer state stay float32. bfloat16 has float32's exponent range,
    so gradients do not underflow and no loss scaler is needed: ``backward``,
    ``step``, gradient clipping, accumulation and the state dict are
    :class:`OptimWrapper`'s.

    Args:
        **kwargs: Keyword arguments passed to :class:`OptimWrapper`
            (``optimizer``, ``accumulative_counts``, ``clip_grad``).

    Examples:
        >>> from aa_det.utils.compat import autocast_dtype
        >>> wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
        >>> with wrapper.optim_context(nn.Linear(2, 2)):
        ...     autocast_dtype('cpu')
        torch.bfloat16
    """

    @contextmanager
    def optim_context(self, model: nn.Module):
        """Enter :class:`OptimWrapper`'s context (no gradient sync while
        accumulating) and CPU bf16 autocast.

        Args:
            model (nn.Module): The training model.
        """
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
