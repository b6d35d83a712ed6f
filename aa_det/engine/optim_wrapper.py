"""mmengine's optimizer wrapper where mmengine 0.10.7 stops on a CPU or under ``torch.compile``.

* Mixed precision on the CPU: mmengine's ``AmpOptimWrapper`` asserts a GPU (CUDA, NPU, MLU or
  MUSA), so ``tools/train.py --amp`` on a CPU machine stopped with an ``AssertionError``;
  :func:`aa_det.engine.load_config` chooses :class:`CPUAmpOptimWrapper` there instead.
* The Runner's ``compile`` option: with a ``paramwise_cfg`` (every detection config here),
  mmengine's constructor makes each param group a ``ConfigDict``, and dynamo (torch 2.14; 2.1.2 steps them)
  stops at the optimizer step that ``train_step`` runs; :func:`aa_det.engine.load_config` builds
  the wrapper with :class:`PlainGroupsOptimWrapperConstructor` when ``compile`` is set.
"""
from contextlib import contextmanager

import torch
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS


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


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class PlainGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, whose optimizer's param groups are plain ``dict``.

    With a ``paramwise_cfg``, ``DefaultOptimWrapperConstructor`` passes the optimizer its
    groups as ``ConfigDict``, which ``torch.compile`` cannot trace through an optimizer step
    (``InternalTorchDynamoError: 'UserDefinedDictVariable' object has no attribute 'items'``, in
    ``SGD.step``: docs/design.md, "Compiling and exporting"). The groups' contents are unchanged.

    Examples:
        >>> constructor = PlainGroupsOptimWrapperConstructor(
        ...     dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, weight_decay=1e-4)),
        ...     dict(norm_decay_mult=0.0))
        >>> {type(group).__name__ for group in constructor(nn.Linear(2, 2)).param_groups}
        {'dict'}
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        """Build mmengine's wrapper, then copy each param group into a ``dict`` in place (before
        any step, so no optimizer state refers to the groups)."""
        wrapper = super().__call__(model)
        groups = wrapper.optimizer.param_groups
        groups[:] = [dict(group) for group in groups]
        return wrapper
