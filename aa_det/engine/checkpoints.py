"""Checkpoints loaded safely and checked before a run loads them: :class:`CheckpointCheckHook`.

mmengine loads ``load_from`` / ``resume`` checkpoints with whatever keys match (a warning among
hundreds of log lines) and trusts the values; on torch >= 2.6 its loader refuses its own Runner
checkpoints (``torch.load(weights_only=True)``: ``Unsupported global: ...HistoryBuffer``). The hook,
which ``configs/_base_/default_runtime.py`` names, makes mmengine's local loader accept them for the
run, and turns every way the checkpoint can be unusable into one :class:`ConfigError` naming the file:
unreadable (empty, truncated, not a checkpoint), damaged bytes (the zip archive's CRC-32 of every
entry), non-finite values, or keys that do not fit the model.
"""
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

# Keys that may differ when ``load_from`` fine-tunes a detector to other classes: the
# classification layers of the detection heads (RetinaNet's ``retina_cls``, the FCOS /
# ATSS family's ``conv_cls``, two-stage ``fc_cls``).
FINE_TUNE_KEYS = re.compile(r'^(bbox_head|roi_head)\.(.*\.)?(retina_cls|conv_cls|fc_cls)\.')


def damaged_zip_entry(path: str) -> Optional[str]:
    """The first entry of the zip archive ``path`` whose bytes fail their CRC-32, or None.

    ``torch.save`` writes a zip archive with a CRC-32 per entry, which ``torch.load`` does not
    verify: damaged tensor bytes load as wrong (often finite) weights. The entries are stored
    uncompressed, so the check reads the file once. A file that is no zip archive (the legacy format, truncated files) is left
    to the loader.
    """
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:  # a damaged header
        return f'(archive structure: {e})'


def read_checkpoint(path: str) -> dict:
    """Load a checkpoint with mmengine's loader (torch's safe loading), on the CPU.

    Args:
        path (str): A local checkpoint file.

    Returns:
        dict: The checkpoint.

    Raises:
        ConfigError: The file is empty, truncated, damaged (an entry fails its CRC)
            or no PyTorch checkpoint, or holds objects safe loading refuses; one line
            naming the file.
    """
    if osp.getsize(path) == 0:
        raise ConfigError(f'checkpoint file is empty (0 bytes): {path}')
    damaged = damaged_zip_entry(path)
    if damaged is not None:
        raise ConfigError(f'checkpoint file is damaged: {path}: entry {damaged} fails its CRC check '
                          '(a broken copy or disk? copy or save it again)')
    try:
        checkpoint = _load_checkpoint(path, map_location='cpu', logger='silent')
    except Exception as e:  # noqa: BLE001  torch raises a different type for every kind of damage
        text = str(e)
        unsupported = re.search(r'Unsupported global: (GLOBAL \S+)', text)
        if unsupported:
            reason = (f'it holds Python objects that safe loading refuses ({unsupported.group(1)}); '
                      'if you trust the file, load it once and save only its state_dict')
        elif 'zip archive' in text or isinstance(e, EOFError):
            reason = 'it is truncated or damaged (an interrupted copy or save?)'
        else:
            reason = f'it is not a PyTorch checkpoint ({type(e).__name__})'
        raise ConfigError(f'checkpoint file cannot be loaded: {path}: {reason}') from None
    if not isinstance(checkpoint, dict):
        raise ConfigError(f'checkpoint file holds a {type(checkpoint).__name__}, not a state dict: {path}')
    return checkpoint


def state_dict_of(checkpoint: dict) -> dict:
    """The model weights of a checkpoint: its ``state_dict`` (or ``model``), else the checkpoint
    itself, with DataParallel's ``module.`` prefix removed as mmengine does."""
    state = checkpoint.get('state_dict', checkpoint.get('model', checkpoint))
    return {re.sub(r'^module\.', '', key): value for key, value in state.items()}


def first_non_finite(tree, path: str = '') -> Optional[str]:
    """The key path of the first floating-point tensor with a NaN or inf value in nested
    dicts / lists, or None."""
    if isinstance(tree, torch.Tensor):
        finite = not tree.is_floating_point() or bool(torch.isfinite(tree).all())
        return None if finite else path
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return None
    for key, value in items:
        found = first_non_finite(value, f'{path}.{key}' if path else str(key))
        if found is not None:
            return found
    return None


def check_fits_model(model: torch.nn.Module, state: dict, path: str, allowed=None):
    """Every key of the model is in ``state`` with its shape, and ``state`` has no other key,
    except keys matching ``allowed`` and modules' optional ``_extra_state`` records.

    Args:
        model (nn.Module): The (unwrapped) model the checkpoint is for.
        state (dict): Its weights, see :func:`state_dict_of`.
        path (str): The checkpoint file, for the message.
        allowed (re.Pattern, optional): Keys that may be missing, unexpected or
            of another shape. Defaults to None (none may).

    Raises:
        ConfigError: One line with the counts and the first key of each kind.
    """
    own = model.state_dict()
    ok = (lambda key: bool(allowed.match(key))) if allowed is not None else (lambda key: False)
    missing = [k for k in own if k not in state and not k.endswith('_extra_state') and not ok(k)]
    unexpected = [k for k in state if k not in own and not ok(k)]
    shapes = [k for k in state if k in own and not ok(k) and isinstance(state[k], torch.Tensor)
              and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = [f'{len(keys)} {what} (first: {keys[0]})' for what, keys in
                 (('missing keys', missing), ('unexpected keys', unexpected),
                  ('keys of another shape', shapes)) if keys]
        raise ConfigError(f'checkpoint does not fit the model: {path}: {", ".join(parts)}')


def usable_checkpoint(path: str) -> dict:
    """:func:`read_checkpoint`, plus a :class:`ConfigError` naming the first non-finite key."""
    checkpoint = read_checkpoint(path)
    bad = first_non_finite({key: checkpoint[key] for key in ('state_dict', 'optimizer') if key in checkpoint}
                           if 'state_dict' in checkpoint else checkpoint)
    if bad is not None:
        raise ConfigError(f'checkpoint holds non-finite values (NaN or inf): {path}: first at {bad}')
    return checkpoint


def latest_usable_checkpoint(work_dir: str) -> Optional[tuple]:
    """What ``--resume`` without a path resumes from: mmengine's latest checkpoint of
    ``work_dir``, or, when that one is unusable, the newest usable ``epoch_*.pth`` /
    ``iter_*.pth`` before it (one warning line saying so).

    Returns:
        tuple[str, dict, str] | None: The path, the checkpoint and, when it is not
        the latest, the line to log; None when the work dir has no checkpoint
        (the run starts from scratch, as in mmengine).
    """
    latest = find_latest_checkpoint(work_dir) if osp.isdir(work_dir) else None
    if latest is None:
        return None
    candidates = sorted(glob.glob(osp.join(work_dir, 'epoch_*.pth')) + glob.glob(osp.join(work_dir, 'iter_*.pth')),
                        key=osp.getmtime, reverse=True)
    first_error = None
    for path in [latest] + [c for c in candidates if not osp.exists(latest) or not osp.samefile(c, latest)]:
        try:
            checkpoint = usable_checkpoint(path) if osp.isfile(path) else None
        except ConfigError as e:
            first_error = first_error or e
            continue
        if checkpoint is None:
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


def run_checkpoint(runner) -> Optional[tuple]:
    """Read and check the checkpoint the Runner will load (``load_from``, or for ``resume``
    without one the latest of its work dir). An auto-resume whose latest checkpoint is unusable
    resumes from the newest usable one instead.

    Returns:
        tuple[str, dict, str] | None: The path, the checkpoint and a line to log (``''``: none);
        None when the run loads no checkpoint.
    """
    path = runner._load_from
    if runner._resume and path is None:
        found = latest_usable_checkpoint(runner.work_dir)
        if found is not None:
            runner._load_from = found[0]  # what load_or_resume resumes from
        return found
    if path is None or '://' in path:  # URLs and other schemes are left to mmengine
        return None
    if not osp.isfile(path):
        raise ConfigError(f'load_from: checkpoint file not found: {path}')
    return path, usable_checkpoint(path), ''


def check_checkpoint_fits(model: torch.nn.Module, path: str, checkpoint: dict, resume: bool, training: bool):
    """The checkpoint ``path`` loads cleanly into ``model``.

    * ``resume``: every key, exactly (a run resumes only from its own checkpoints).
    * ``load_from`` for training: every key but the heads' classification layers
      (:data:`FINE_TUNE_KEYS`: fine-tuning to other classes); those left out are logged.
    * ``load_from`` for testing: every key, exactly.
    """
    state = state_dict_of(checkpoint)
    fine_tune = training and not resume
    hint = '' if resume else ('; to load the keys that fit and initialise the others, pass --partial-load '
                              '(or partial_load=True in the config)')
    try:
        check_fits_model(model, state, path, FINE_TUNE_KEYS if fine_tune else None)
    except ConfigError as e:
        raise ConfigError(f'{e}{hint}') from None
    if fine_tune:
        own = model.state_dict()
        differ = [k for k in own if FINE_TUNE_KEYS.match(k) and (k not in state or state[k].shape != own[k].shape)]
        if differ:
            print_log(f'aa_det: load_from {path}: {len(differ)} classification-layer keys do not fit and keep '
                      f'their initialisation (first: {differ[0]})', logger='current', level=30)


@HOOKS.register_module()
class CheckpointCheckHook(Hook):
    """Load the run's checkpoints with torch's safe loading, after checking the one it resumes or loads.

    From ``before_run`` to ``after_run``, mmengine's loader of local files (``load_from``,
    ``resume``, ``Pretrained`` ``init_cfg``) allows the types mmengine's own checkpoints hold
    (:func:`aa_det.utils.mmengine_checkpoint_globals`). In ``before_run``, after the datasets
    are built and before the weights are initialised or loaded, the checkpoint the run will load
    is read (:func:`usable_checkpoint`) and must fit the model (:func:`check_checkpoint_fits`);
    ``partial_load=True`` in the config (``tools/train.py --partial-load``) lets one that does not
    fit load its matching keys.
    """

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local_safely, force=True)
        found = run_checkpoint(runner)
        if found is None:
            return
        path, checkpoint, note = found
        if note:
            runner.logger.warning(note)
        if not runner.cfg.get('partial_load'):
            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            training = isinstance(runner._train_loop, BaseLoop)  # built by Runner.train() only
            check_checkpoint_fits(model, path, checkpoint, bool(runner._resume), training)

    def after_run(self, runner) -> None:
        CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
