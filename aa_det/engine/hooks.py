"""Training hooks.

* ``StopOnNonFiniteLoss``: mmdet's ``CheckInvalidLossHook`` with one clear line. mmdet's hook
  asserts a finite loss; its assertion message is ``None`` (the return value of the
  ``logger.info`` it passes) after a traceback. This one checks the same loss at the same
  interval and stops training with a :class:`NonFiniteLossError`, which the tools print as one
  ``aa_det:`` line.
* ``StopOnNonFiniteOutputs``: validation and testing end with one clear line when the backbone's
  features or the predicted boxes / scores hold NaN or inf (a detector whose features are NaN
  predicts nothing, so COCO mAP alone would read as a poor model, not a broken one).
* ``CompileBackboneHook``: ``torch.compile`` of the backbone's forward only, in one graph
  (``fullgraph=True``) for every size with ``dynamic=True``. mmengine's Runner option ``compile``
  compiles the whole ``train_step`` instead (with what ``tools/config_runner.py`` sets for it), with
  graph breaks in mmdet's target assignment and logging; the attention kernels are in the backbone (docs/design.md, "Compiling and exporting").
* ``EagerDataPreprocessorHook``: the data preprocessor outside ``torch.compile``, for the Runner's
  ``compile`` option (``load_config`` adds it).
* ``StaticModuleIntsHook``: the modules' int attributes traced as constants under the Runner's
  ``compile`` option on torch < 2.6, as from 2.6 on (``load_config`` adds it).
* ``NumClassesCheckHook``: mmdet's ``NumClassCheckHook`` with one clear line, for the validation set
  before training and for the test set too.
* ``HeadNormCheckHook``: one warning when a dense head applies its BatchNorms to every FPN level.

``load_config`` (``tools/config_runner.py``) is the tools' command-line semantics.
"""
from types import SimpleNamespace
from typing import List, Optional, Tuple

import torch
from mmdet.engine.hooks import CheckInvalidLossHook, NumClassCheckHook
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from ..utils.compat import module_ints_constant
from ..utils.errors import ConfigError


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


class NonFiniteOutputError(ConfigError):
    """Validation or testing produced NaN or inf features or predictions; the message says where."""


def _tensors(output):
    """The tensors of a module's output (a tensor, or a tuple / list of them)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return []


def _finite(tensors) -> bool:
    """No NaN or inf in any floating-point tensor of ``tensors`` (one host read for all)."""
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point()]
    return not flags or bool(torch.stack(flags).all())


def first_non_finite_module(module: torch.nn.Module, inputs: tuple, prefix: str) -> str:
    """The name of the first submodule of ``module`` (in the order their forwards finish) whose
    output holds NaN or inf when ``module`` runs on ``inputs`` again; ``prefix`` if none does."""
    found = []

    def check(name):
        def fn(_, __, output):
            if not found and not _finite(_tensors(output)):
                found.append(name)
        return fn

    handles = [m.register_forward_hook(check(f'{prefix}.{name}' if name else prefix))
               for name, m in module.named_modules()]
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else prefix


@HOOKS.register_module()
class StopOnNonFiniteOutputs(Hook):
    """End validation and testing with one line when outputs hold NaN or inf.

    Every batch, the backbone's features (a forward hook on ``model.backbone``) and the
    predicted ``bboxes`` / ``scores`` are checked (one host read for the features, one per image
    for its predictions). At the first non-finite batch the backbone runs once more on its input
    with a hook on every submodule, to name the first one whose output is not finite. After the last batch of an
    evaluation with any, :class:`NonFiniteOutputError` says how many batches were non-finite,
    the first batch's input size and module (the tools print it as one ``aa_det:`` line and exit
    non-zero; checkpoints saved so far are kept). ``configs/_base_/default_runtime.py`` sets it
    as ``default_hooks.check_outputs``.
    """

    priority = 'LOW'

    def __init__(self) -> None:
        self._handle = None
        self.bad_batches, self.first, self._checking, self._bad_features = 0, None, False, False

    def _watch(self, runner) -> None:
        """Reset the counts; watch the backbone's outputs."""
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.bad_batches, self.first, self._checking, self._bad_features = 0, None, False, False
        backbone = getattr(model, 'backbone', None)
        if backbone is not None and self._handle is None:
            self._handle = backbone.register_forward_hook(self._check_features)

    def _check_features(self, module, inputs, output) -> None:
        if self._checking or _finite(_tensors(output)):
            return
        self._bad_features = True
        if self.first is None:
            self._checking = True  # the re-run below goes through this hook again
            try:
                where = first_non_finite_module(module, inputs, 'backbone')
            finally:
                self._checking = False
            size = 'x'.join(str(d) for d in inputs[0].shape) if inputs else '?'
            self.first = f'backbone features, input {size}, first at {where}'

    def _check_batch(self, runner, phase: str, batch_idx: int, outputs, num_batches: int) -> None:
        bad = self._bad_features
        if not bad:
            for sample in outputs or ():
                pred = getattr(sample, 'pred_instances', None)
                if pred is not None and not _finite([pred.get(k) for k in ('bboxes', 'scores')
                                                     if isinstance(pred.get(k), torch.Tensor)]):
                    bad = True
                    if self.first is None:
                        self.first = f'predictions, image {sample.metainfo.get("img_path", "?")}'
                    break
        self._bad_features = False
        self.bad_batches += bad
        if batch_idx + 1 == num_batches:
            self._unwatch()
            if self.bad_batches:
                message = (f'{phase} stopped: non-finite outputs in {self.bad_batches} of {num_batches} batches '
                           f'(first: {self.first}); the metrics would be meaningless. Causes: test sizes far above '
                           'the training size (GSA: attention.axial_scale), a damaged checkpoint, a training run '
                           'that diverged')
                runner.logger.error(message)
                raise NonFiniteOutputError(message)

    def _unwatch(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def before_val_epoch(self, runner) -> None:
        self._watch(runner)

    def before_test_epoch(self, runner) -> None:
        self._watch(runner)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._check_batch(runner, 'validation', batch_idx, outputs, len(runner.val_dataloader))

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._check_batch(runner, 'testing', batch_idx, outputs, len(runner.test_dataloader))

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._unwatch()

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._unwatch()


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
    ``tools/config_runner.py`` adds this hook when ``compile`` is set.
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
    it changes nothing. ``tools/config_runner.py`` adds this hook when ``compile`` is set.
    """

    def before_train(self, runner) -> None:  # after the Runner compiled train_step
        runner.model.train_step = module_ints_constant(runner.model.train_step)


@HOOKS.register_module()
class NumClassesCheckHook(NumClassCheckHook):
    """mmdet's ``NumClassCheckHook``: every head's ``num_classes`` is the number of the dataset's
    classes, for the training set before each epoch, the validation set before training and
    before each validation (mmdet's checks it only then, after the training epochs) and the test
    set before testing. A mismatch stops the run with one :class:`ConfigError` line.
    """

    def _check_head(self, runner, mode: str, split: Optional[str] = None) -> None:
        try:
            super()._check_head(runner, mode)
        except AssertionError as e:
            raise ConfigError(f'{split or mode}_dataloader.dataset: {e}; set model.*head.num_classes to the '
                              'number of metainfo.classes') from None

    def before_train(self, runner) -> None:
        if runner.val_loop is not None:
            self._check_head(runner, 'val')

    def before_test_epoch(self, runner) -> None:
        # mmdet's check reads the validation loader: give it the test loader in its place
        view = SimpleNamespace(model=runner.model, logger=runner.logger, val_dataloader=runner.test_dataloader)
        self._check_head(view, 'val', split='test')


def shared_head_norms(head: torch.nn.Module) -> List[Tuple[str, int]]:
    """The BatchNorms of a dense head that its forward applies more than once: to several FPN levels.

    The head runs once in eval mode, under ``no_grad``, on one 4x4 map per level (its
    ``prior_generator.num_levels`` maps of its ``in_channels``); module modes and statistics are
    left as they were. A head without those attributes, without BatchNorms, or whose forward does
    not run on such maps, gives ``[]``.

    Returns:
        list[tuple[str, int]]: ``(module name, times applied in one forward)`` of each shared BatchNorm.

    Example:
        >>> from mmdet.registry import MODELS
        >>> head = MODELS.build(dict(type='RetinaHead', num_classes=3, in_channels=8, feat_channels=8,
        ...                          stacked_convs=1, norm_cfg=dict(type='BN')))
        >>> shared_head_norms(head)
        [('cls_convs.0.bn', 5), ('reg_convs.0.bn', 5)]
    """
    norms = {name: m for name, m in head.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    levels = getattr(getattr(head, 'prior_generator', None), 'num_levels', None)
    channels = getattr(head, 'in_channels', None)
    if not norms or not isinstance(levels, int) or not isinstance(channels, int):
        return []
    calls = dict.fromkeys(norms, 0)
    handles = [m.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
               for name, m in norms.items()]
    modes = {m: m.training for m in head.modules()}
    parameter = next(head.parameters())
    try:
        head.eval()
        with torch.no_grad():
            head(tuple(parameter.new_zeros(1, channels, 4, 4) for _ in range(levels)))
    except Exception:  # noqa: BLE001  a head whose forward wants more than its levels' maps: not inspected
        return []
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes.items():
            m.training = training
    return [(name, n) for name, n in calls.items() if n > 1]


def shared_head_norm_warning(model: torch.nn.Module) -> Optional[str]:
    """One line naming the dense head whose forward applies its BatchNorms to every FPN level
    (mmdet's ``RetinaHead`` with a BN ``norm_cfg``), what that costs at evaluation and the fix;
    ``None`` when no head does."""
    for key in ('bbox_head', 'rpn_head'):
        head = getattr(model, key, None)
        shared = shared_head_norms(head) if isinstance(head, torch.nn.Module) else []
        if not shared:
            continue
        name = type(head).__name__
        levels = max(calls for _, calls in shared)
        fix = (f"type='RetinaSepBNHead' with num_ins={levels} (convs shared, one BatchNorm per level; "
               "optim_wrapper.paramwise_cfg.bypass_duplicate=True)" if name == 'RetinaHead'
               else 'a head with one BatchNorm per level')
        return (f'model.{key} ({name}) applies each of its {len(shared)} BatchNorms to all {levels} FPN levels: '
                "their running statistics average the levels' distributions, so evaluation in eval mode "
                f'scores far below what the weights reach; use {fix}, or norm_cfg=dict(type=\'GN\', '
                'num_groups=32); tools/analysis_tools/bn_check.py measures the gap')
    return None


@HOOKS.register_module()
class HeadNormCheckHook(Hook):
    """Warn once per run, before it starts, when a dense head shares its BatchNorms across FPN
    levels (:func:`shared_head_norm_warning`; docs/detection.md, "BatchNorm in the head")."""

    def before_run(self, runner) -> None:
        warning = shared_head_norm_warning(runner.model.module if is_model_wrapper(runner.model) else runner.model)
        if warning:
            runner.logger.warning(warning)


__all__ = ['CompileBackboneHook', 'EagerDataPreprocessorHook', 'NonFiniteLossError', 'NonFiniteOutputError',
           'StaticModuleIntsHook', 'StopOnNonFiniteLoss', 'StopOnNonFiniteOutputs', 'first_non_finite_module',
           'NumClassesCheckHook', 'HeadNormCheckHook', 'shared_head_norms']
