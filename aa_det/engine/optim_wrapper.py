"""Optimizer wrappers a config names: an optimizer wrapper constructor with one
param group per setting, which the schedules name, mixed precision on a CPU
(what ``--amp`` runs there), and the constructor mmengine's ``compile`` option
needs (what our tools set where a config compiles)."""
import inspect
from contextlib import contextmanager

import torch
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import (OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS,
                               OPTIMIZERS)


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, with the param groups whose settings are
    equal merged into one.

    With a ``paramwise_cfg`` mmengine gives every parameter its own group, and
    SGD's foreach kernels run once per group (docs/benchmarks.md counts them).
    Merged, the groups are as many as the distinct settings, in the order of
    their first parameter, and every parameter gets the same update. An
    optimizer state saved with per-parameter groups does not load into merged
    ones (``load_from`` its weights instead).

    Examples:
        >>> import logging
        >>> # mmengine logs every parameter's settings
        >>> logging.disable(logging.INFO)
        >>> constructor = MergedGroupsOptimWrapperConstructor(
        ...     dict(type='OptimWrapper',
        ...          optimizer=dict(type='SGD', lr=0.1, momentum=0.9,
        ...                         weight_decay=1e-4)),
        ...     dict(norm_decay_mult=0.0, bias_decay_mult=0.0))
        >>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
        ...                       nn.Conv2d(4, 4, 1))
        >>> [(len(g['params']), g['weight_decay'])
        ...  for g in constructor(model).optimizer.param_groups]
        [(2, 0.0001), (4, 0.0)]
        >>> logging.disable(logging.NOTSET)
    """

    def __call__(self, model: nn.Module) -> OptimWrapper:
        wrapper = super().__call__(model)
        merged = {}
        for group in wrapper.optimizer.param_groups:
            settings = tuple(
                sorted((key, repr(value)) for key, value in group.items()
                       if key != 'params'))
            merged.setdefault(settings, {
                **group, 'params': []
            })['params'].extend(group['params'])
        # before any step: no state refers to a group
        wrapper.optimizer.param_groups[:] = list(merged.values())
        return wrapper


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """mmengine's ``AmpOptimWrapper`` for the CPU, where that one asserts a
    GPU: the forward (data preprocessing and losses included) runs under
    ``torch.autocast('cpu', dtype=torch.bfloat16)``; parameters, gradients and
    optimizer state stay float32, and no loss scaler is needed (bf16 has
    float32's exponent range). Everything else is :class:`OptimWrapper`'s.

    Examples:
        >>> from aa_det.utils.compat import autocast_dtype
        >>> wrapper = CPUAmpOptimWrapper(
        ...     optimizer=torch.optim.SGD(nn.Linear(2, 2).parameters(),
        ...                               lr=0.1))
        >>> with wrapper.optim_context(nn.Linear(2, 2)):
        ...     autocast_dtype('cpu')
        torch.bfloat16
    """

    @contextmanager
    def optim_context(self, model: nn.Module):
        """:class:`OptimWrapper`'s context (no gradient sync while
        accumulating) under CPU bf16 autocast."""
        with super().optim_context(model), torch.autocast(
                'cpu', dtype=torch.bfloat16):
            yield


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class CompileOptimWrapperConstructor(MergedGroupsOptimWrapperConstructor):
    """:class:`MergedGroupsOptimWrapperConstructor` for an optimizer step
    that mmengine's ``compile`` option can trace; none of its three changes
    alters the update (docs/design.md, "Compiling and exporting", has the
    reproductions):

    * plain ``dict`` param groups: torch 2.14's dynamo stops in ``SGD.step``
      on mmengine's ``ConfigDict`` ones;
    * ``foreach=True`` where the optimizer takes it and the config does not
      set it: torch 2.1's dynamo stops in SGD's per-tensor kernel with
      momentum (the CPU's default);
    * SGD's momentum buffers created at zero (with momentum and no dampening
      the first step then computes the buffer SGD would clone from the
      gradient): torch 2.14's dynamo, with ``dynamic=True`` and several param
      groups, stops where SGD creates them.

    Examples:
        >>> constructor = CompileOptimWrapperConstructor(
        ...     dict(type='OptimWrapper', optimizer=dict(
        ...         type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4)),
        ...     dict(norm_decay_mult=0.0))
        >>> optimizer = constructor(nn.Linear(2, 2)).optimizer
        >>> ({type(group).__name__ for group in optimizer.param_groups},
        ...  optimizer.defaults['foreach'])
        ({'dict'}, True)
        >>> [s['momentum_buffer'].shape for s in optimizer.state.values()]
        [torch.Size([2, 2]), torch.Size([2])]
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict = None):
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        optimizer_type = self.optimizer_cfg['type']
        if isinstance(optimizer_type, str):  # as mmengine's constructor does
            with OPTIMIZERS.switch_scope_and_registry(None) as registry:
                optimizer_type = registry.get(optimizer_type)
        if optimizer_type is not None and 'foreach' in inspect.signature(
                optimizer_type).parameters:
            # a copy: the config is not changed
            self.optimizer_cfg = {'foreach': True, **self.optimizer_cfg}

    def __call__(self, model: nn.Module) -> OptimWrapper:
        wrapper = super().__call__(model)
        optimizer = wrapper.optimizer
        optimizer.param_groups[:] = [
            dict(group) for group in optimizer.param_groups
        ]
        if isinstance(optimizer, torch.optim.SGD):
            for group in optimizer.param_groups:
                if group['momentum'] != 0 and group['dampening'] == 0:
                    for p in group['params']:
                        if p.requires_grad:
                            optimizer.state[p]['momentum_buffer'] = \
                                torch.zeros_like(p)
        return wrapper
