"""Hooks a config names (``configs/_base_/default_runtime.py``, or a user's
``custom_hooks``): the checks that stop a run with one clear line, the
head-BatchNorm warning, and ``CompileBackboneHook``."""
from types import SimpleNamespace
from typing import List, Optional, Tuple

import torch
from mmdet.datasets import BaseDetDataset
from mmdet.engine.hooks import CheckInvalidLossHook, NumClassCheckHook
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.runner import BaseLoop

from ..datasets.checked_coco import CheckedCocoDataset, check_images
from ..utils.compat import module_ints_constant
from ..utils.errors import ConfigError, RunError


def _unwrapped(runner) -> torch.nn.Module:
    return runner.model.module if is_model_wrapper(
        runner.model) else runner.model


class NonFiniteLossError(RunError):
    """The training loss became NaN or inf; the message says where."""


class NonFiniteOutputError(RunError):
    """Validation or testing produced NaN or inf features or predictions; the
    message says where."""


@HOOKS.register_module()
class StopOnNonFiniteLoss(CheckInvalidLossHook):
    """mmdet's ``CheckInvalidLossHook`` (which asserts with the message
    ``None``), stopping training with :class:`NonFiniteLossError` when the loss
    is NaN or inf, every ``interval`` iterations (default 1: the loss is read
    on the host every iteration anyway, to be logged)."""

    def __init__(self, interval: int = 1) -> None:
        super().__init__(interval)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        if not self.every_n_train_iters(runner, self.interval) or bool(
                torch.isfinite(outputs['loss'])):
            return
        terms = ', '.join(f'{key}: {float(value):.4g}'
                          for key, value in outputs.items())
        message = ((
            f'training stopped: non-finite loss at epoch {runner.epoch + 1}, '
            f'iteration {runner.iter + 1} ({terms}); the checkpoints saved '
            f'so far are kept. Causes: a learning rate too high '
            f'(optim_wrapper.optimizer.lr) or no gradient clipping '
            f'(optim_wrapper.clip_grad), broken boxes in the data '
            f'(tools/check_dataset.py), a damaged load_from checkpoint'))
        runner.logger.error(message)
        raise NonFiniteLossError(message)


@HOOKS.register_module()
class EarlyNumClassCheckHook(NumClassCheckHook):
    """mmdet's ``NumClassCheckHook`` (each head's ``num_classes`` against the
    dataset's classes) with one :class:`ConfigError` line, also in
    ``before_run`` (weights not loaded yet) for every dataset of the run:
    mmdet's checks validation data only when validation starts, after training,
    and never test data."""

    def _check_head(self,
                    runner,
                    mode: str,
                    split: Optional[str] = None) -> None:
        try:
            super()._check_head(runner, mode)
        except AssertionError as e:
            raise ConfigError(
                f'{split or mode}_dataloader.dataset: {e}; set '
                f'model.*head.num_classes to the number of metainfo.classes'
            ) from None

    def before_run(self, runner) -> None:
        # the loops Runner.train / val / test built for this run (reading
        # another would build it)
        if isinstance(runner._train_loop, BaseLoop):
            self._check_head(runner, 'train')
        if isinstance(runner._val_loop, BaseLoop):
            self._check_head(runner, 'val')
        # mmdet's check reads the validation loader: given the test one
        if isinstance(runner._test_loop, BaseLoop):
            view = SimpleNamespace(
                model=runner.model,
                logger=runner.logger,
                val_dataloader=runner.test_dataloader)
            self._check_head(view, 'val', split='test')


def _leaf_datasets(dataset):
    """The datasets inside mmengine's and mmdet's wrappers (``datasets``,
    ``dataset``)."""
    inner = getattr(
        dataset, 'datasets',
        None) or ([dataset.dataset] if hasattr(dataset, 'dataset') else None)
    if not inner:
        yield dataset
        return
    for each in inner:
        yield from _leaf_datasets(each)


@HOOKS.register_module()
class DatasetCheckHook(Hook):
    """:class:`~aa_det.datasets.CheckedCocoDataset`'s image checks (every image
    exists; its header parses and gives the annotation file's size) for the
    datasets of other types, e.g. mmdet's ``CocoDataset`` in a user's own
    config, in ``before_run`` (datasets built, nothing trained): one
    :class:`ConfigError` line for the first problem."""

    def before_run(self, runner) -> None:
        for loop in (runner._train_loop, runner._val_loop, runner._test_loop):
            # the loops Runner.train / val / test built for this run
            if not isinstance(loop, BaseLoop):
                continue
            for dataset in _leaf_datasets(loop.dataloader.dataset):
                if (isinstance(dataset, BaseDetDataset)
                        and not isinstance(dataset, CheckedCocoDataset)
                        and dataset.backend_args is None):
                    dataset.full_init()
                    check_images(dataset.data_list, dataset.ann_file)


def _finite(output) -> bool:
    """No NaN or inf in the floating-point tensors of ``output`` (a tensor, or
    a sequence), one host read."""
    tensors = (
        [output] if isinstance(output, torch.Tensor) else
        [t for t in output
         if isinstance(t, torch.Tensor)] if isinstance(output,
                                                       (tuple, list)) else [])
    flags = [torch.isfinite(t).all() for t in tensors if t.is_floating_point()]
    return not flags or bool(torch.stack(flags).all())


def first_non_finite_module(module: torch.nn.Module, inputs: tuple,
                            prefix: str) -> str:
    """The name of the first submodule of ``module`` (in the order their
    forwards finish) whose output holds NaN or inf when ``module`` runs on
    ``inputs`` again; ``prefix`` if none does."""
    found = []
    handles = [
        m.register_forward_hook(lambda _, __, out, name=f'{prefix}.{name}'
                                if name else prefix: None if found or _finite(
                                    out) else found.append(name))
        for name, m in module.named_modules()
    ]
    try:
        with torch.no_grad():
            module(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else prefix


@HOOKS.register_module()
class StopOnNonFiniteOutputs(Hook):
    """End validation and testing with :class:`NonFiniteOutputError` when the
    backbone's features or the predicted ``bboxes`` / ``scores`` of any batch
    hold NaN or inf (a detector whose features are NaN predicts nothing: COCO
    mAP alone reads as a poor model). At the first bad batch the backbone runs
    once more with a hook on every submodule, to name the first whose output is
    not finite."""

    priority = 'LOW'

    def __init__(self) -> None:
        (self._handle, self.bad_batches, self.first, self._checking,
         self._bad_features) = (None, 0, None, False, False)

    def _watch(self, runner) -> None:
        self.bad_batches, self.first, self._checking, self._bad_features = (
            0, None, False, False)
        backbone = getattr(_unwrapped(runner), 'backbone', None)
        if backbone is not None and self._handle is None:
            self._handle = backbone.register_forward_hook(self._check_features)

    def _check_features(self, module, inputs, output) -> None:
        if self._checking or _finite(output):
            return
        self._bad_features = True
        if self.first is None:
            # the re-run below goes through this hook again
            self._checking = True
            try:
                where = first_non_finite_module(module, inputs, 'backbone')
            finally:
                self._checking = False
            size = 'x'.join(str(d) for d in inputs[0].shape) if inputs else '?'
            self.first = f'backbone features, input {size}, first at {where}'

    def _check_batch(self, runner, phase: str, batch_idx: int, outputs,
                     num_batches: int) -> None:
        bad = self._bad_features
        for sample in () if bad else outputs or ():
            pred = getattr(sample, 'pred_instances', None)
            if (pred is not None and
                    not _finite([pred.get(k) for k in ('bboxes', 'scores')])):
                bad = True
                self.first = (
                    self.first or f'predictions, image '
                    f'{sample.metainfo.get("img_path", "?")}')
                break
        self._bad_features = False
        self.bad_batches += bad
        if batch_idx + 1 == num_batches:
            self._unwatch()
            if self.bad_batches:
                message = ((
                    f'{phase} stopped: non-finite outputs in '
                    f'{self.bad_batches} of {num_batches} batches (first: '
                    f'{self.first}); the metrics would be meaningless. '
                    f'Causes: test sizes far above the training size (GSA: '
                    f'attention.axial_scale), a damaged checkpoint, a '
                    f'training run that diverged'))
                runner.logger.error(message)
                raise NonFiniteOutputError(message)

    def _unwatch(self, *_, **__) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    before_val_epoch = before_test_epoch = _watch
    after_val_epoch = after_test_epoch = _unwatch

    def after_val_iter(self,
                       runner,
                       batch_idx: int,
                       data_batch=None,
                       outputs=None) -> None:
        self._check_batch(runner, 'validation', batch_idx, outputs,
                          len(runner.val_dataloader))

    def after_test_iter(self,
                        runner,
                        batch_idx: int,
                        data_batch=None,
                        outputs=None) -> None:
        self._check_batch(runner, 'testing', batch_idx, outputs,
                          len(runner.test_dataloader))


def shared_head_norms(head: torch.nn.Module) -> List[Tuple[str, int]]:
    """``(name, times applied in one forward)`` of each BatchNorm of a dense
    head that its forward applies more than once (to several FPN levels), from
    one eval-mode, ``no_grad`` forward on a 4x4 map per level (modes and
    statistics left as they were); ``[]`` for a head it cannot run so."""
    norms = {
        name: m
        for name, m in head.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
    }
    levels = getattr(
        getattr(head, 'prior_generator', None), 'num_levels', None)
    channels = getattr(head, 'in_channels', None)
    if not norms or not isinstance(levels, int) or not isinstance(
            channels, int):
        return []
    calls = dict.fromkeys(norms, 0)
    handles = [
        m.register_forward_hook(
            lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
        for name, m in norms.items()
    ]
    modes = {m: m.training for m in head.modules()}
    try:
        head.eval()
        with torch.no_grad():
            head(
                tuple(
                    next(head.parameters()).new_zeros(1, channels, 4, 4)
                    for _ in range(levels)))
    # a head whose forward wants more than its levels' maps: not inspected
    except Exception:  # noqa: BLE001
        return []
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes.items():
            m.training = training
    return [(name, n) for name, n in calls.items() if n > 1]


@HOOKS.register_module()
class HeadNormCheckHook(Hook):
    """Warn when a run starts if a dense head applies its BatchNorms to every
    FPN level: their running statistics average the levels', and eval mode
    scores far below what the weights reach (docs/detection.md, "BatchNorm in
    the head")."""

    def before_run(self, runner) -> None:
        for key in ('bbox_head', 'rpn_head'):
            head = getattr(_unwrapped(runner), key, None)
            shared = shared_head_norms(head) if isinstance(
                head, torch.nn.Module) else []
            if shared:
                name, levels = type(head).__name__, max(calls
                                                        for _, calls in shared)
                fix = ((f"type='RetinaSepBNHead' with num_ins={levels} (convs "
                        f"shared, one BatchNorm per level; "
                        f"optim_wrapper.paramwise_cfg.bypass_duplicate=True)"
                        if name == 'RetinaHead' else
                        'a head with one BatchNorm per level'))
                runner.logger.warning(
                    f'model.{key} ({name}) applies each of its {len(shared)} '
                    f'BatchNorms to all {levels} FPN levels: '
                    f"their running statistics average the levels' "
                    f"distributions, so evaluation in eval mode scores far "
                    f"below what the weights reach; use {fix}, or "
                    f"norm_cfg=dict(type='GN', "
                    'num_groups=32); tools/analysis_tools/bn_check.py '
                    'measures the gap')


@HOOKS.register_module()
class CompileBackboneHook(Hook):
    """``torch.compile`` of ``model.backbone``'s forward before training
    starts, in one graph (``fullgraph=True`` by default), for every size with
    ``dynamic=True``; the modules' int attributes traced as constants on every
    torch release. A backbone with ``with_cp=True`` needs ``fullgraph=False``
    (its checkpointed blocks run eagerly between graphs).

    Args:
        **compile_cfg: keyword arguments of ``torch.compile`` (``backend``,
            ``mode``, ``dynamic``, ...).
    """

    def __init__(self, **compile_cfg) -> None:
        self.compile_cfg = dict(dict(fullgraph=True), **compile_cfg)

    def before_train(self, runner) -> None:
        model = _unwrapped(runner)
        if self.compile_cfg['fullgraph'] and getattr(model.backbone, 'with_cp',
                                                     False):
            raise ConfigError(
                'CompileBackboneHook: fullgraph=True cannot capture the '
                'backbone\'s with_cp=True (its checkpointed blocks run '
                'between graphs); set fullgraph=False in the hook, or '
                'with_cp=False')
        model.backbone.forward = module_ints_constant(
            torch.compile(model.backbone.forward, **self.compile_cfg))
        runner.logger.info(
            f'backbone forward compiled with torch.compile({self.compile_cfg})'
        )


@HOOKS.register_module()
class EagerDataPreprocessorHook(Hook):
    """Run the data preprocessor outside mmengine's ``compile`` option (a
    graph break at its call): dynamo stops in mmengine's ``stack_batch`` on
    torch 2.1 and inductor with ``dynamic=True`` on torch 2.14; its
    normalisation and padding are a few element-wise ops, not worth a graph.
    Our tools add it where a config sets ``compile``."""

    def before_train(self, runner) -> None:
        preprocessor = _unwrapped(runner).data_preprocessor
        preprocessor.forward = torch._dynamo.disable(preprocessor.forward)


@HOOKS.register_module()
class StaticModuleIntsHook(Hook):
    """Trace the modules' int attributes as constants under mmengine's
    ``compile`` option, as torch does from 2.6 on
    (:func:`aa_det.utils.compat.module_ints_constant`): before 2.6, dynamo
    makes them symbolic under dynamic shapes and retraces the attention
    layers' size arithmetic at every size. Our tools add it where a config
    sets ``compile``."""

    def before_train(self, runner) -> None:  # after the Runner compiled it
        runner.model.train_step = module_ints_constant(runner.model.train_step)
