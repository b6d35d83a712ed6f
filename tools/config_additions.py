"""What :func:`config_runner.load_config` adds to a config where the machine or mmengine's ``compile``
option needs it, registered in mmengine's and mmdet's registries when our tools import this module:

* ``CompileOptimWrapperConstructor``, ``EagerDataPreprocessorHook``, ``StaticModuleIntsHook``: what
  the ``compile`` option needs on the installed torch (docs/design.md, "Compiling and exporting").
"""
import inspect

import torch
import torch.nn as nn
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIMIZERS

from aa_det.engine import MergedGroupsOptimWrapperConstructor
from aa_det.utils.compat import module_ints_constant


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class CompileOptimWrapperConstructor(MergedGroupsOptimWrapperConstructor):
    """:class:`MergedGroupsOptimWrapperConstructor` for an optimizer step that mmengine's ``compile``
    option can trace; none of its three changes alters the update (docs/design.md, "Compiling and
    exporting", has the reproductions):

    * plain ``dict`` param groups: torch 2.14's dynamo stops in ``SGD.step`` on mmengine's
      ``ConfigDict`` ones;
    * ``foreach=True`` where the optimizer takes it and the config does not set it: torch 2.1's
      dynamo stops in SGD's per-tensor kernel with momentum (the CPU's default);
    * SGD's momentum buffers created at zero (with momentum and no dampening the first step then
      computes the buffer SGD would clone from the gradient): torch 2.14's dynamo, with
      ``dynamic=True`` and several param groups, stops where SGD creates them.

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


@HOOKS.register_module()
class EagerDataPreprocessorHook(Hook):
    """Run the data preprocessor outside mmengine's ``compile`` option (a graph break at its call):
    dynamo stops in mmengine's ``stack_batch`` on torch 2.1 and inductor with ``dynamic=True`` on torch
    2.14; its normalisation and padding are a few element-wise ops, not worth a graph."""

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        model.data_preprocessor.forward = torch._dynamo.disable(model.data_preprocessor.forward)


@HOOKS.register_module()
class StaticModuleIntsHook(Hook):
    """Trace the modules' int attributes as constants under mmengine's ``compile`` option, as torch does
    from 2.6 on (:func:`aa_det.utils.compat.module_ints_constant`): before 2.6, dynamo makes them symbolic
    under dynamic shapes and retraces the attention layers' size arithmetic at every size."""

    def before_train(self, runner) -> None:  # after the Runner compiled train_step
        runner.model.train_step = module_ints_constant(runner.model.train_step)
