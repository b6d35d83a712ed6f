"""An optimizer wrapper constructor with one param group per setting, which the schedules name."""
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS


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
