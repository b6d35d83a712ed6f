"""Training hooks.

* ``StopOnNonFiniteLoss``: mmdet's ``CheckInvalidLossHook`` with one clear line. mmdet's hook
  asserts a finite loss; its assertion message is ``None`` (the return value of the
  ``logger.info`` it passes) after a traceback. This one checks the same loss at the same
  interval and stops training with a :class:`NonFiniteLossError`, which the tools print as one
  ``aa_det:`` line.
* ``CompileBackboneHook``: ``torch.compile`` of the backbone's forward only, in one graph
  (``fullgraph=True``) for every size with ``dynamic=True``. mmengine's Runner option ``compile``
  compiles the whole ``train_step`` instead (it runs with what :func:`aa_det.engine.load_config`
  sets for it), with graph breaks in mmdet's target assignment and logging; the attention kernels
  are in the backbone (docs/design.md, "Compiling and exporting").
* ``EagerDataPreprocessorHook``: the data preprocessor outside ``torch.compile``, for the Runner's
  ``compile`` option (``load_config`` adds it).
* ``StaticModuleIntsHook``: the modules' int attributes traced as constants under the Runner's
  ``compile`` option on torch < 2.6, as from 2.6 on (``load_config`` adds it).
"""
from typing import Optional

import torch
from mmdet.engine.hooks import CheckInvalidLossHook
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from ..utils.compat import module_ints_constant
from .errors import ConfigError


class NonFiniteLossError(ConfigError):
    """The training loss became NaN or inf; the message says where."""


@HOOKS.register_module()
class StopOnNonFiniteLoss(CheckInvalidLossHook):
    """Stop training when the loss is NaN or inf.

    Args:
        interval (int): Check every ``interval`` iterations. The loss is
            already read on the host every iteration (mmengine's message hub
            logs it), so the default, 1, costs nothing. Defaults to 1.
    """

    def __init__(self, interval: int = 1) -> None:
        super().__init__(interval)

    def after_train_iter(self, runner, batch_idx: int, data_batch: Optional[dict] = None,
                         outputs: Optional[dict] = None) -> None:
        """Raise :class:`NonFiniteLossError` on a non-finite ``outputs['loss']``."""
        if not self.every_n_train_iters(runner, self.interval) or bool(torch.isfinite(outputs['loss'])):
            return
        terms = ', '.join(f'{key}: {float(value):.4g}' for key, value in outputs.items())
        message = (f'training stopped: non-finite loss at epoch {runner.epoch + 1}, iteration {runner.iter + 1} '
                   f'({terms}); the checkpoints saved so far are kept. Causes: a learning rate too high '
                   '(optim_wrapper.optimizer.lr) or no gradient clipping (optim_wrapper.clip_grad), '
                   'broken boxes in the data (tools/check_dataset.py), a damaged load_from checkpoint')
        runner.logger.error(message)
        raise NonFiniteLossError(message)


@HOOKS.register_module()
class CompileBackboneHook(Hook):
    """Compile ``model.backbone``'s forward with ``torch.compile`` before training starts.

    ``custom_hooks = [dict(type='CompileBackboneHook', dynamic=True)]`` in a config: one graph
    per backbone with ``fullgraph=True`` (the default), traced once for every size under
    multiscale jitter with ``dynamic=True``. Inductor on the CPU (torch 2.14.1) still compiles
    each size once more: every convolution's backward specialises the sizes there
    (docs/design.md, "Compiling and exporting"). The modules' int attributes are traced as
    constants on every torch release (:func:`aa_det.utils.compat.module_ints_constant`).

    A backbone with ``with_cp=True`` needs ``fullgraph=False``: its checkpointed blocks run
    eagerly between graphs (dynamo cannot capture them: the relative-offset record they update).

    Args:
        **compile_cfg: keyword arguments of ``torch.compile`` (``backend``, ``mode``,
            ``dynamic``, ...); ``fullgraph`` defaults to True.
    """

    def __init__(self, **compile_cfg) -> None:
        self.compile_cfg = dict(dict(fullgraph=True), **compile_cfg)

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if self.compile_cfg['fullgraph'] and getattr(model.backbone, 'with_cp', False):
            raise ConfigError('CompileBackboneHook: fullgraph=True cannot capture the backbone\'s with_cp=True '
                              '(its checkpointed blocks run between graphs); set fullgraph=False in the hook, '
                              'or with_cp=False')
        model.backbone.forward = module_ints_constant(torch.compile(model.backbone.forward, **self.compile_cfg))
        runner.logger.info(f'backbone forward compiled with torch.compile({self.compile_cfg})')


@HOOKS.register_module()
class EagerDataPreprocessorHook(Hook):
    """Run the data preprocessor outside ``torch.compile`` (a graph break at its call).

    mmengine's Runner option ``compile`` traces the whole ``train_step``, the data
    preprocessor included, where dynamo stops in mmengine's ``stack_batch`` on torch 2.1
    (``scalar_tensor(): argument 's' (position 1) must be Number``) and inductor stops with
    ``dynamic=True`` on torch 2.14 (``cannot determine truth value of Relational``); its
    normalisation and padding are a few element-wise ops, not worth a graph.
    :func:`aa_det.engine.load_config` adds this hook when ``compile`` is set.
    """

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        model.data_preprocessor.forward = torch._dynamo.disable(model.data_preprocessor.forward)


@HOOKS.register_module()
class StaticModuleIntsHook(Hook):
    """Trace the modules' int attributes as constants under mmengine's Runner option ``compile``.

    Dynamo before torch 2.6 makes them symbolic under dynamic shapes
    (:func:`aa_det.utils.compat.module_ints_constant`): the demo with
    ``compile=dict(backend='aot_eager', dynamic=True)`` had not trained its 2 iterations after
    500 s on torch 2.4.1 (2 CPU cores), and trained them in 190 s with this hook. From torch 2.6 on
    it changes nothing. :func:`aa_det.engine.load_config` adds this hook when ``compile`` is set.
    """

    def before_train(self, runner) -> None:  # after the Runner compiled train_step
        runner.model.train_step = module_ints_constant(runner.model.train_step)


__all__ = ['CompileBackboneHook', 'EagerDataPreprocessorHook', 'NonFiniteLossError', 'StaticModuleIntsHook',
           'StopOnNonFiniteLoss']
