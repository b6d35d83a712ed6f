"""Checkpoints loaded safely and checked before a run loads them (:class:`CheckpointCheckHook`): mmengine
loads whatever keys match (a warning among hundreds of log lines), trusts the values, and on torch >= 2.6
refuses its own Runner checkpoints (``Unsupported global: ...HistoryBuffer``)."""
import glob
import os.path as osp
import re
import zipfile
import zlib
from typing import Optional

import torch
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.runner import BaseLoop
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint, find_latest_checkpoint, load_from_local

from ..utils.errors import ConfigError
from ..utils.safe_load import mmengine_checkpoint_globals

#: keys that may differ when ``load_from`` fine-tunes a detector to other classes: the heads'
#: classification layers (RetinaNet's ``retina_cls``, FCOS / ATSS's ``conv_cls``, two-stage ``fc_cls``)
FINE_TUNE_KEYS = re.compile(r'^(bbox_head|roi_head)\.(.*\.)?(retina_cls|conv_cls|fc_cls)\.')


def read_checkpoint(path: str) -> dict:
    """The checkpoint ``path``, loaded on the CPU with mmengine's loader under torch's safe loading;
    a :class:`ConfigError` naming the file when it is empty, damaged (the CRC-32 of every entry of its
    zip archive, which ``torch.load`` does not verify: damaged bytes load as wrong, often finite,
    weights), truncated, not a checkpoint, holds objects safe loading refuses, or NaN / inf values."""
    if osp.getsize(path) == 0:
        raise ConfigError(f'checkpoint file is empty (0 bytes): {path}')
    if zipfile.is_zipfile(path):  # the legacy format and truncated files are left to the loader
        try:
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:  # a damaged header
            damaged = f'(archive structure: {e})'
        if damaged is not None:
            raise ConfigError(f'checkpoint file is damaged: {path}: entry {damaged} fails its CRC check '
                              '(a broken copy or disk? copy or save it again)')
    try:
        with mmengine_checkpoint_globals():
            checkpoint = _load_checkpoint(path, map_location='cpu', logger='silent')
    except Exception as e:  # noqa: BLE001  torch raises a different type for every kind of damage
        unsupported = re.search(r'Unsupported global: (GLOBAL \S+)', str(e))
        if unsupported:
            reason = (f'it holds Python objects that safe loading refuses ({unsupported.group(1)}); '
                      'if you trust the file, load it once and save only its state_dict')
        elif 'zip archive' in str(e) or isinstance(e, EOFError):
            reason = 'it is truncated or damaged (an interrupted copy or save?)'
        else:
            reason = f'it is not a PyTorch checkpoint ({type(e).__name__})'
        raise ConfigError(f'checkpoint file cannot be loaded: {path}: {reason}') from None
    if not isinstance(checkpoint, dict):
        raise ConfigError(f'checkpoint file holds a {type(checkpoint).__name__}, not a state dict: {path}')
    bad = first_non_finite({key: checkpoint[key] for key in ('state_dict', 'optimizer') if key in checkpoint}
                           if 'state_dict' in checkpoint else checkpoint)
    if bad is not None:
        raise ConfigError(f'checkpoint holds non-finite values (NaN or inf): {path}: first at {bad}')
    return checkpoint


def first_non_finite(tree, path: str = '') -> Optional[str]:
    """The key path of the first floating-point tensor with a NaN or inf in nested dicts / lists, or None."""
    if isinstance(tree, torch.Tensor):
        return None if not tree.is_floating_point() or bool(torch.isfinite(tree).all()) else path
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        found = first_non_finite(value, f'{path}.{key}' if path else str(key))
        if found is not None:
            return found
    return None


def check_fits_model(model: torch.nn.Module, state: dict, path: str, allowed=None):
    """Every key of ``model`` is in ``state`` with its shape and ``state`` has no other, except keys
    matching the pattern ``allowed`` and modules' optional ``_extra_state``; else one line with the
    counts and the first key of each kind."""
    own = model.state_dict()
    ok = (lambda key: bool(allowed.match(key))) if allowed is not None else (lambda key: False)
    missing = [k for k in own if k not in state and not k.endswith('_extra_state') and not ok(k)]
    unexpected = [k for k in state if k not in own and not ok(k)]
    shapes = [k for k in state if k in own and not ok(k) and isinstance(state[k], torch.Tensor)
              and state[k].shape != own[k].shape]
    parts = [f'{len(keys)} {what} (first: {keys[0]})' for what, keys in
             (('missing keys', missing), ('unexpected keys', unexpected), ('keys of another shape', shapes)) if keys]
    if parts:
        raise ConfigError(f'checkpoint does not fit the model: {path}: {", ".join(parts)}')


def latest_usable_checkpoint(work_dir: str) -> Optional[tuple]:
    """``(path, checkpoint, line to log or '')`` of what ``resume`` without ``load_from`` resumes from:
    mmengine's latest checkpoint of ``work_dir`` or, when that one is unusable, the newest usable
    ``epoch_*.pth`` / ``iter_*.pth``; None when the work dir has none (a fresh start, as in mmengine)."""
    latest = find_latest_checkpoint(work_dir) if osp.isdir(work_dir) else None
    if latest is None:
        return None
    candidates = sorted(glob.glob(osp.join(work_dir, 'epoch_*.pth')) + glob.glob(osp.join(work_dir, 'iter_*.pth')),
                        key=osp.getmtime, reverse=True)
    first_error = None
    for path in [latest] + [c for c in candidates if not osp.exists(latest) or not osp.samefile(c, latest)]:
        if not osp.isfile(path):
            continue
        try:
            checkpoint = read_checkpoint(path)
        except ConfigError as e:
            first_error = first_error or e
            continue
        note = '' if path == latest else (f'aa_det: the latest checkpoint is unusable '
                                          f'({first_error or f"{latest} not found"}); resuming from {path}')
        return path, checkpoint, note
    raise first_error or ConfigError(f'--resume: the latest checkpoint {latest} is missing and {work_dir} '
                                     'holds no other epoch_*.pth / iter_*.pth')


def load_from_local_safely(filename, map_location):
    """mmengine's loader of local files, with mmengine's checkpoint types allowed by torch's safe loading."""
    with mmengine_checkpoint_globals():
        return load_from_local(filename, map_location)


@HOOKS.register_module()
class CheckpointCheckHook(Hook):
    """From ``before_run`` to ``after_run`` mmengine's loader of local files (``load_from``, ``resume``,
    ``Pretrained``) allows the types mmengine's checkpoints hold; in ``before_run`` (datasets built, no
    weights loaded yet) the checkpoint the run will load is read (:func:`read_checkpoint`) and must fit
    the model: exactly for ``resume`` and testing, up to :data:`FINE_TUNE_KEYS` (logged) for ``load_from``
    in training, anything with ``partial_load=True`` (``--partial-load``: mmengine loads what fits)."""

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local_safely, force=True)
        path, resume = runner._load_from, bool(runner._resume)
        if resume and path is None:
            found = latest_usable_checkpoint(runner.work_dir)
            if found is None:
                return
            path, checkpoint, note = found
            runner._load_from = path  # what load_or_resume resumes from
            if note:
                runner.logger.warning(note)
        elif path is None or '://' in path:  # URLs and other schemes are left to mmengine
            return
        elif not osp.isfile(path):
            raise ConfigError(f'load_from: checkpoint file not found: {path}')
        else:
            checkpoint = read_checkpoint(path)
        if runner.cfg.get('partial_load'):
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        fine_tune = isinstance(runner._train_loop, BaseLoop) and not resume  # Runner.train() builds the loop
        state = checkpoint.get('state_dict', checkpoint.get('model', checkpoint))
        state = {re.sub(r'^module\.', '', k): v for k, v in state.items()}  # DataParallel's prefix, as mmengine
        try:
            check_fits_model(model, state, path, FINE_TUNE_KEYS if fine_tune else None)
        except ConfigError as e:
            hint = '' if resume else ('; to load the keys that fit and initialise the others, pass '
                                      '--partial-load (or partial_load=True in the config)')
            raise ConfigError(f'{e}{hint}') from None
        own = model.state_dict()
        differ = [k for k in own if fine_tune and FINE_TUNE_KEYS.match(k)
                  and (k not in state or state[k].shape != own[k].shape)]
        if differ:
            print_log(f'aa_det: load_from {path}: {len(differ)} classification-layer keys do not fit and keep '
                      f'their initialisation (first: {differ[0]})', logger='current', level=30)

    def after_run(self, runner) -> None:
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
