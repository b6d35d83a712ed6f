"""Optimizer wrappers a config names: an optimizer wrapper constructor with one param group per setting,
which the schedules name, and mixed precision on a CPU (what ``--amp`` runs there)."""
from contextlib import contextmanager

import torch
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, with the param groups whose settings are equal merged into one.

    With a ``paramwise_cfg`` mmengine gives every parameter its own group, and SGD's foreach kernels
    run once per group (docs/benchmarks.md counts them). Merged, the groups are as many as the distinct settings, in the order of
    their first parameter, and every parameter gets the same update. An optimizer state saved with
    per-parameter groups does not load into merged ones (``load_from`` its weights instead).

    Examples:
        >>> import logging
        >>> logging.disable(logging.INFO)  # mmengine logs every parameter's settings
        >>> constructor = MergedGroupsOptimWrapperConstructor(
        ...     dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4)),
        ...     dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
        >>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1))
        >>> [(len(g['params']), g['weight_decay']) for g in constructor(model).optimizer.param_groups]
        [(2, 0.0001), (4, 0.0)]
        >>> logging.disable(logging.NOTSET)
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        wrapper = super().__call__(model)
        merged = {}
        for group in wrapper.optimizer.param_groups:
            settings = tuple(sorted((key, repr(value)) for key, value in group.items() if key != 'params'))
            merged.setdefault(settings, {**group, 'params': []})['params'].extend(group['params'])
        wrapper.optimizer.param_groups[:] = list(merged.values())  # before any step: no state refers to a group
        return wrapper


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """mmengine's ``AmpOptimWrapper`` for the CPU, where that one asserts a GPU: the forward (data
    preprocessing and losses included) runs under ``torch.autocast('cpu', dtype=torch.bfloat16)``;
    parameters, gradients and optimizer state stay float32, and no loss scaler is needed (bf16 has
    float32's exponent range). Everything else is :class:`OptimWrapper`'s.

    Examples:
        >>> from aa_det.utils.compat import autocast_dtype
        >>> wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
        >>> with wrapper.optim_context(nn.Linear(2, 2)):
        ...     autocast_dtype('cpu')
        torch.bfloat16
    """

    @contextmanager
    def optim_context(self, model: nn.Module):
        """:class:`OptimWrapper`'s context (no gradient sync while accumulating) under CPU bf16 autocast."""
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
