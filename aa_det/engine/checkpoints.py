"""Checkpoints that torch's safe loading reads (:class:`SafeCheckpointHook`),
and checked before a run loads them (:class:`CheckpointCheckHook`).

mmengine 0.10.7's Runner writes its ``MessageHub`` state as ``HistoryBuffer``
objects holding numpy arrays, which torch >= 2.6's ``torch.load``
(``weights_only=True``) refuses (``Unsupported global: ...HistoryBuffer``):
mmdet's ``init_detector``, ``DetInferencer``, ``tools/test.py``, ``load_from``
and ``--resume`` all fail on such a file. With :class:`SafeCheckpointHook` the
Runner writes them as plain tensors and numbers instead, and reads them back
into the ``MessageHub`` on resume; nothing is allowed beyond torch's own safe
types. mmengine loads whatever keys match (a warning among hundreds of log
lines) and trusts the values: :class:`CheckpointCheckHook` checks the file
first.
"""
import glob
import os.path as osp
import re
import zipfile
import zlib
from collections import OrderedDict
from typing import Optional

import numpy as np
import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer, print_log
from mmengine.model import BaseTTAModel, is_model_wrapper
from mmengine.runner import BaseLoop
from mmengine.runner.checkpoint import (_load_checkpoint,
                                        _load_checkpoint_to_model,
                                        find_latest_checkpoint)

from ..models.backbones.unloaded_weights import refuse_frozen_unloaded
from ..utils.errors import ConfigError, refused_global, unsafe_checkpoint_error

#: keys that may differ when ``load_from`` fine-tunes a detector to other
#: classes: the heads' classification layers (RetinaNet's ``retina_cls``, FCOS
#: / ATSS's ``conv_cls``, two-stage ``fc_cls``)
FINE_TUNE_KEYS = re.compile(
    r'^(bbox_head|roi_head)\.(.*\.)?(retina_cls|conv_cls|fc_cls)\.')


def read_checkpoint(path: str) -> dict:
    """The checkpoint ``path``, loaded on the CPU with mmengine's loader under
    torch's safe loading; a :class:`ConfigError` naming the file when it is
    empty, damaged (the CRC-32 of every entry of its zip archive, which
    ``torch.load`` does not verify: damaged bytes load as wrong, often finite,
    weights), truncated, not a checkpoint, holds objects safe loading refuses,
    or NaN / inf values."""
    if osp.getsize(path) == 0:
        raise ConfigError(f'checkpoint file is empty (0 bytes): {path}')
    # the legacy format and truncated files are left to the loader
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
        # a damaged header
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
            damaged = f'(archive structure: {e})'
        if damaged is not None:
            raise ConfigError(
                f'checkpoint file is damaged: {path}: entry {damaged} fails '
                f'its CRC check (a broken copy or disk? copy or save it '
                f'again)')
    try:
        checkpoint = _load_checkpoint(
            path, map_location='cpu', logger='silent')
    # torch raises a different type for every kind of damage
    except Exception as e:  # noqa: BLE001
        unsupported = refused_global(e)
        if unsupported:
            raise unsafe_checkpoint_error(path, unsupported) from None
        if 'zip archive' in str(e) or isinstance(e, EOFError):
            reason = ('it is truncated or damaged (an interrupted copy or '
                      'save?)')
        else:
            reason = f'it is not a PyTorch checkpoint ({type(e).__name__})'
        raise ConfigError(
            f'checkpoint file cannot be loaded: {path}: {reason}') from None
    if not isinstance(checkpoint, dict):
        raise ConfigError(
            f'checkpoint file holds a {type(checkpoint).__name__}, not a '
            f'state dict: {path}')
    bad = first_non_finite({
        key: checkpoint[key]
        for key in ('state_dict', 'optimizer') if key in checkpoint
    } if 'state_dict' in checkpoint else checkpoint)
    if bad is not None:
        raise ConfigError(
            f'checkpoint holds non-finite values (NaN or inf): {path}: first '
            f'at {bad}')
    return checkpoint


def first_non_finite(tree, path: str = '') -> Optional[str]:
    """The key path of the first floating-point tensor with a NaN or inf in
    nested dicts / lists, or None."""
    if isinstance(tree, torch.Tensor):
        return None if not tree.is_floating_point() or bool(
            torch.isfinite(tree).all()) else path
    items = tree.items() if isinstance(
        tree, dict) else enumerate(tree) if isinstance(tree,
                                                       (list, tuple)) else ()
    for key, value in items:
        found = first_non_finite(value, f'{path}.{key}' if path else str(key))
        if found is not None:
            return found
    return None


def check_fits_model(model: torch.nn.Module,
                     state: dict,
                     path: str,
                     allowed=None):
    """Every key of ``model`` is in ``state`` with its shape and ``state`` has
    no other, except keys matching the pattern ``allowed`` and modules'
    optional ``_extra_state``; else one line with the counts and the first key
    of each kind."""
    own = model.state_dict()
    ok = (lambda key: bool(allowed.match(key))) if allowed is not None else (
        lambda key: False)
    missing = [
        k for k in own
        if k not in state and not k.endswith('_extra_state') and not ok(k)
    ]
    unexpected = [k for k in state if k not in own and not ok(k)]
    shapes = [
        k for k in state
        if k in own and not ok(k) and isinstance(state[k], torch.Tensor)
        and state[k].shape != own[k].shape
    ]
    parts = [
        f'{len(keys)} {what} (first: {keys[0]})'
        for what, keys in (('missing keys', missing), ('unexpected keys',
                                                       unexpected),
                           ('keys of another shape', shapes)) if keys
    ]
    if parts:
        raise ConfigError(
            f'checkpoint does not fit the model: {path}: {", ".join(parts)}')


def latest_usable_checkpoint(work_dir: str) -> Optional[tuple]:
    """``(path, checkpoint, line to log or '')`` of what ``resume`` without
    ``load_from`` resumes from: mmengine's latest checkpoint of ``work_dir``
    or, when that one is unusable, the newest usable ``epoch_*.pth`` /
    ``iter_*.pth``; None when the work dir has none (a fresh start, as in
    mmengine)."""
    latest = find_latest_checkpoint(work_dir) if osp.isdir(work_dir) else None
    if latest is None:
        return None
    candidates = sorted(
        glob.glob(osp.join(work_dir, 'epoch_*.pth')) +
        glob.glob(osp.join(work_dir, 'iter_*.pth')),
        key=osp.getmtime,
        reverse=True)
    first_error = None
    for path in [latest] + [
            c for c in candidates
            if not osp.exists(latest) or not osp.samefile(c, latest)
    ]:
        if not osp.isfile(path):
            continue
        try:
            checkpoint = read_checkpoint(path)
        except ConfigError as e:
            first_error = first_error or e
            continue
        note = '' if path == latest else (
            f'aa_det: the latest checkpoint is unusable '
            f'({first_error or f"{latest} not found"}); resuming from {path}')
        return path, checkpoint, note
    raise first_error or ConfigError(
        f'--resume: the latest checkpoint {latest} is missing and {work_dir} '
        'holds no other epoch_*.pth / iter_*.pth')


@HOOKS.register_module()
class CheckpointCheckHook(Hook):
    """In ``before_run`` (datasets built, no weights loaded yet) the checkpoint
    the run will load is read (:func:`read_checkpoint`) and must fit the model:
    exactly for ``resume`` and testing, up to :data:`FINE_TUNE_KEYS` (logged)
    for ``load_from`` in training, anything with ``partial_load=True``
    (``--partial-load``: mmengine loads what fits). ``resume`` with no
    checkpoint in the work dir says so in one line and starts from scratch, as
    mmengine does. In ``before_train`` (every load done, no iteration run) a
    backbone's frozen weights that nothing loaded are refused in one line
    (:func:`~aa_det.models.backbones.unloaded_weights.refuse_frozen_unloaded`;
    the backbone alone only warns). The Runner then loads what this hook read
    (:func:`load_once`): the file is read once."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        refuse_frozen_unloaded(model)

    def before_run(self, runner) -> None:
        path, resume = runner._load_from, bool(runner._resume)
        if resume and path is None:
            found = latest_usable_checkpoint(runner.work_dir)
            if found is None:
                runner.logger.warning(
                    f'aa_det: resume: no checkpoint in {runner.work_dir} to '
                    f'resume from; training starts from scratch')
                return
            path, checkpoint, note = found
            runner._load_from = path  # what load_or_resume resumes from
            if note:
                runner.logger.warning(note)
        # URLs and other schemes are left to mmengine
        elif path is None or '://' in path:
            return
        elif not osp.isfile(path):
            raise ConfigError(f'load_from: checkpoint file not found: {path}')
        else:
            checkpoint = read_checkpoint(path)
        load_once(runner, path, checkpoint)
        if runner.cfg.get('partial_load'):
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        # mmengine loads into its module
        model = model.module if isinstance(model, BaseTTAModel) else model
        # Runner.train() builds the loop
        fine_tune = isinstance(runner._train_loop, BaseLoop) and not resume
        state = checkpoint.get('state_dict',
                               checkpoint.get('model', checkpoint))
        # DataParallel's prefix, as mmengine
        state = {re.sub(r'^module\.', '', k): v for k, v in state.items()}
        try:
            check_fits_model(model, state, path,
                             FINE_TUNE_KEYS if fine_tune else None)
        except ConfigError as e:
            hint = '' if resume else (
                '; to load the keys that fit and initialise the others, pass '
                '--partial-load (or partial_load=True in the config)')
            raise ConfigError(f'{e}{hint}') from None
        own = model.state_dict()
        differ = [
            k for k in own if fine_tune and FINE_TUNE_KEYS.match(k) and (
                k not in state or state[k].shape != own[k].shape)
        ]
        if differ:
            print_log(
                f'aa_det: load_from {path}: {len(differ)} '
                f'classification-layer keys do not fit and keep their '
                f'initialisation (first: {differ[0]})',
                logger='current',
                level=30)


def load_once(runner, path: str, checkpoint: dict) -> None:
    """The Runner's next ``load_checkpoint(path)`` (``load_from``, or
    ``resume`` through it) loads ``checkpoint``, already read, instead of
    reading the file again; the method is mmengine's ``Runner.load_checkpoint``
    with its first line replaced, and is restored after that call."""
    load = runner.load_checkpoint

    def load_checkpoint(filename,
                        map_location='cpu',
                        strict=False,
                        revise_keys=[(r'^module.', '')]):
        runner.load_checkpoint = load
        if filename != path:
            return load(filename, map_location, strict, revise_keys)
        runner.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        loaded = _load_checkpoint_to_model(
            model, checkpoint, strict, revise_keys=revise_keys)
        runner._has_loaded = True
        runner.logger.info(f'Load checkpoint from {filename}')
        return loaded

    runner.load_checkpoint = load_checkpoint


#: the key that marks a ``HistoryBuffer`` written as plain data by
#: :func:`to_safe_types`
HISTORY_BUFFER = '__mmengine_history_buffer__'


def to_safe_types(value):
    """``value`` with what torch's safe loading refuses written as what it
    reads: mmengine's ``HistoryBuffer`` as a marked dict of its histories
    (tensors) and ``max_length``, numpy arrays as lists, numpy scalars as
    Python numbers, dict subclasses (``Counter``) as dicts; dicts, lists and
    tuples recursively, anything else as it is.

    Examples:
        >>> safe = to_safe_types(
        ...     {'loss': HistoryBuffer([0.5, 0.25], [1, 1]),
        ...      'lr': np.float64(0.01)})
        >>> safe['lr'], safe['loss']['log_history'].tolist()
        (0.01, [0.5, 0.25])
        >>> float(from_safe_types(safe)['loss'].mean())
        0.375
    """
    if isinstance(value, HistoryBuffer):
        return {
            HISTORY_BUFFER:
            True,
            'log_history':
            torch.from_numpy(np.array(value._log_history, dtype=float)),
            'count_history':
            torch.from_numpy(np.array(value._count_history, dtype=float)),
            'max_length':
            value.max_length
        }
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    # a Counter (MultiStepLR's milestones) as a dict: torch 2.1 refuses Counter
    if isinstance(value, dict):
        return (OrderedDict if isinstance(value, OrderedDict) else dict)(
            (key, to_safe_types(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(to_safe_types(item) for item in value)
    return value


def from_safe_types(value):
    """The ``HistoryBuffer`` objects that :func:`to_safe_types` wrote, rebuilt;
    anything else as it is."""
    if isinstance(value, dict) and value.get(HISTORY_BUFFER):
        return HistoryBuffer(value['log_history'].numpy(),
                             value['count_history'].numpy(),
                             value['max_length'])
    if isinstance(value, dict):
        return type(value)(
            (key, from_safe_types(item)) for key, item in value.items())
    return value


@HOOKS.register_module()
class SafeCheckpointHook(Hook):
    """The Runner's checkpoints written with torch's safe types only
    (:func:`to_safe_types` on everything but the model's ``state_dict``), so
    that ``torch.load(weights_only=True)`` reads them, and therefore every
    mmdet and mmengine entry point on torch >= 2.6; on resume, the
    ``MessageHub``'s histories read back. Last of the hooks (``VERY_LOW``),
    after the others have added to the checkpoint."""

    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for key, value in checkpoint.items():
            # an OrderedDict with _metadata, tensors only
            if key != 'state_dict':
                checkpoint[key] = to_safe_types(value)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if isinstance(checkpoint.get('message_hub'), dict):
            checkpoint['message_hub'] = from_safe_types(
                checkpoint['message_hub'])
