"""mmengine's optimizer wrapper where mmengine 0.10.7 stops on a CPU or under ``torch.compile``.

* Mixed precision on the CPU: mmengine's ``AmpOptimWrapper`` asserts a GPU (CUDA, NPU, MLU or
  MUSA), so ``tools/train.py --amp`` on a CPU machine stopped with an ``AssertionError``;
  ``tools/config_runner.py`` chooses :class:`CPUAmpOptimWrapper` there instead.
* The Runner's ``compile`` option traces the optimizer step that ``train_step`` runs. With a
  ``paramwise_cfg`` (every detection config here), mmengine's constructor makes each param group a
  ``ConfigDict``, where dynamo stops on torch 2.14; torch 2.1's dynamo stops at the first step of
  SGD's per-tensor kernel with momentum (the CPU's default), torch 2.14's with ``dynamic=True`` at
  the first step of SGD with momentum and several param groups. ``tools/config_runner.py``
  builds the wrapper with :class:`CompileOptimWrapperConstructor` when ``compile`` is set.
"""
import inspect
from contextlib import contextmanager

import torch
import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, OPTIMIZERS


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
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, with the param groups whose settings are equal merged into one.

    With a ``paramwise_cfg``, ``DefaultOptimWrapperConstructor`` gives every parameter its own param
    group, and an optimizer steps group by group: SGD's foreach kernels then run once per parameter,
    about 900 of the 4,900 CUDA kernels of a RetinaNet ResNet-50 training step (docs/benchmarks.md, "On a
    GPU"), on a step bound by launches. Merged, the groups are as many as the distinct settings (two for
    ``norm_decay_mult=0, bias_decay_mult=0``: with and without weight decay), in the order of their first
    parameter, and every parameter gets the same update. A checkpoint's optimizer state from the
    per-parameter groups does not load into the merged ones (``--resume`` of such a run): load its
    weights with ``load_from`` instead.

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
        optimizer = wrapper.optimizer
        merged = {}
        for group in optimizer.param_groups:
            settings = tuple(sorted((key, repr(value)) for key, value in group.items() if key != 'params'))
            merged.setdefault(settings, {**group, 'params': []})['params'].extend(group['params'])
        optimizer.param_groups[:] = list(merged.values())  # before any step: no state refers to a group
        return wrapper


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class CompileOptimWrapperConstructor(MergedGroupsOptimWrapperConstructor):
    """:class:`MergedGroupsOptimWrapperConstructor`, for an optimizer step that ``torch.compile`` can trace.

    Three differences, none of which changes the update:

    * The param groups are plain ``dict``. With a ``paramwise_cfg``,
      ``DefaultOptimWrapperConstructor`` passes them as ``ConfigDict``, and torch 2.14's dynamo
      stops in ``SGD.step`` (``InternalTorchDynamoError: 'UserDefinedDictVariable' object has no
      attribute 'items'``).
    * ``foreach=True`` where the optimizer takes it and the config does not set it (CUDA's
      default already). On the CPU, torch 2.1's dynamo stops at the first step of SGD's per-tensor
      kernel with momentum (``list index out of range`` in ``_single_tensor_sgd``).
    * SGD's momentum buffers exist from the start, zero, in every group with momentum and no
      dampening: the first step computes ``0 * momentum + grad``, the buffer SGD would have
      cloned from ``grad``. Torch 2.14's dynamo, with ``dynamic=True`` and more than one param
      group (one per parameter with a ``paramwise_cfg``), stops at the first step, where SGD
      creates them (``SpeculationLogDivergence`` at ``state["momentum_buffer"] = ...``).

    docs/design.md, "Compiling and exporting", has the reproductions.

    Examples:
        >>> constructor = CompileOptimWrapperConstructor(
        ...     dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4)),
        ...     dict(norm_decay_mult=0.0))
        >>> optimizer = constructor(nn.Linear(2, 2)).optimizer
        >>> {type(group).__name__ for group in optimizer.param_groups}, optimizer.defaults['foreach']
        ({'dict'}, True)
        >>> [state['momentum_buffer'].shape for state in optimizer.state.values()]
        [torch.Size([2, 2]), torch.Size([2])]
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict = None):
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        optimizer_type = self.optimizer_cfg['type']
        if isinstance(optimizer_type, str):  # looked up as mmengine's constructor does
            with OPTIMIZERS.switch_scope_and_registry(None) as registry:
                optimizer_type = registry.get(optimizer_type)
        if optimizer_type is not None and 'foreach' in inspect.signature(optimizer_type).parameters:
            self.optimizer_cfg = {'foreach': True, **self.optimizer_cfg}  # a copy: the config is not changed

    def __call__(self, model: nn.Module) -> OptimWrapper:
        """Build mmengine's wrapper, copy each param group into a ``dict`` in place (before any
        step, so no optimizer state refers to the groups), then create SGD's momentum buffers."""
        wrapper = super().__call__(model)
        optimizer = wrapper.optimizer
        optimizer.param_groups[:] = [dict(group) for group in optimizer.param_groups]
        if isinstance(optimizer, torch.optim.SGD):
            for group in optimizer.param_groups:
                if group['momentum'] != 0 and group['dampening'] == 0:
                    for p in group['params']:
                        if p.requires_grad:
                            optimizer.state[p]['momentum_buffer'] = torch.zeros_like(p)
        return wrapper
