"""What tools/train.py and tools/test.py add to a config: the command-line
semantics of mmdet's tools, and the changes this machine needs; then mmengine's
Runner.

A config means what it says here as in mmdet's own tools: :func:`load_config`
changes only what the command line asks for (``--work-dir``, ``--cfg-options``,
``--amp``, ``--auto-scale-lr``, ``--resume``, ``--partial-load``) and what the
machine needs (mixed precision on a CPU, a distributed run without GPUs,
mmengine's ``compile`` option on the installed torch); docs/detection.md lists
each change. The checks that protect a run live in what the configs name (the
dataset, the metric, the hooks of ``configs/_base_/default_runtime.py``);
:func:`build_runner` adds the ones that must run before the model is built
(``config_checks.py``). Every type these changes name is registered by
``import aa_det`` (``aa_det.engine``), so a config dumped here runs in mmdet's
tools; a config that does not import aa_det through ``custom_imports`` is
refused here as there (``config_checks.check_custom_imports``).
"""
import functools
import gc
import os.path as osp
from typing import Optional

import torch
import torch.distributed as dist
from config_checks import check_run_config
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from aa_det.utils.compat import TORCH_VERSION
from aa_det.utils.errors import (ConfigError, refused_global,
                                 unsafe_checkpoint_error)


def _replace_type(cfg, old: str, new: str):
    """Recursively replace ``type=old`` configs by ``type=new``."""
    if isinstance(cfg, dict):
        if cfg.get('type') == old:
            cfg['type'] = new
        for value in cfg.values():
            _replace_type(value, old, new)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            _replace_type(value, old, new)


def _prepare_compile(cfg: Config, path: str) -> None:
    """Make mmengine's ``compile`` option (``torch.compile`` of ``train_step``)
    run: an optimizer step dynamo can trace, the data preprocessor outside the
    graph, the modules' ints constant and, on torch < 2.4, static shapes
    (docs/design.md, "Compiling and exporting")."""
    if (cfg.get('optim_wrapper') is not None and cfg.optim_wrapper.get(
            'constructor', 'DefaultOptimWrapperConstructor')
            in ('DefaultOptimWrapperConstructor',
                'MergedGroupsOptimWrapperConstructor')):
        cfg.optim_wrapper.constructor = 'CompileOptimWrapperConstructor'
    hooks = list(cfg.get('custom_hooks') or [])
    types = {hook.get('type') for hook in hooks}
    cfg.custom_hooks = hooks + [
        dict(type=name)
        for name in ('EagerDataPreprocessorHook', 'StaticModuleIntsHook')
        if name not in types
    ]
    if TORCH_VERSION < (2, 4):
        compile_cfg = dict(cfg.compile) if isinstance(cfg.compile,
                                                      dict) else {}
        if compile_cfg.get('dynamic'):
            raise ConfigError(
                f'{path}: compile.dynamic=True needs torch >= 2.4 (this is '
                f'torch {torch.__version__}, whose '
                "dynamo stops at symbolic sizes in mmdet's FocalLoss and in "
                "the attention kernels); "
                'set compile.dynamic=False (one compile per input size)')
        # torch 2.1 turns a second size dynamic, where it stops as above
        compile_cfg['dynamic'] = False
        cfg.compile = compile_cfg


def _read_config(path: str) -> Config:
    """The config file, or one :class:`ConfigError` line for a missing file or
    a missing package scope."""
    if not osp.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    try:
        return Config.fromfile(path)
    # mmengine: a package scope's base (mmpretrain::) whose package is missing
    except ModuleNotFoundError as e:
        hint = (': pip install mmpretrain==1.2.0 model-index (docs/setup.md)'
                if 'mmpretrain' in str(e) else '')
        raise ConfigError(f'{path}: {e}{hint}') from None


def _prepare_cpu_distributed(cfg: Config) -> None:
    """A distributed run without CUDA: SyncBN -> BN (SyncBN runs only on GPUs),
    gloo, DDP without device ids."""
    _replace_type(cfg.model, 'SyncBN', 'BN')
    if cfg.get('env_cfg', {}).get('dist_cfg'):
        cfg.env_cfg.dist_cfg.backend = 'gloo'
    if cfg.get('model_wrapper_cfg') is None:
        # mmengine passes device_ids=[LOCAL_RANK], which DDP rejects for a CPU
        # model; a config value wins over the Runner's default arguments.
        cfg.model_wrapper_cfg = dict(
            type='MMDistributedDataParallel',
            device_ids=None,
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))


def _prepare_amp(cfg: Config, amp: bool, amp_dtype: Optional[str]) -> None:
    """``--amp`` / ``--amp-dtype``: ``AmpOptimWrapper`` on CUDA; without CUDA,
    ``amp`` or an ``AmpOptimWrapper`` in the config becomes
    ``CPUAmpOptimWrapper`` (no loss scale, no dtype)."""
    if amp_dtype is not None:
        if not amp:
            raise ConfigError(f'--amp-dtype {amp_dtype} needs --amp')
        if amp_dtype not in ('float16', 'bfloat16'):
            raise ConfigError(
                f"--amp-dtype must be 'float16' or 'bfloat16', not "
                f"{amp_dtype!r}")
    if amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        if torch.cuda.is_available():
            cfg.optim_wrapper.loss_scale = 'dynamic'
            if amp_dtype is not None:
                cfg.optim_wrapper.dtype = amp_dtype
    if not torch.cuda.is_available() and cfg.get(
            'optim_wrapper', {}).get('type') == 'AmpOptimWrapper':
        for key in ('loss_scale', 'dtype', 'use_fsdp'):
            cfg.optim_wrapper.pop(key, None)
        cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'


def _prepare_resume(cfg: Config, resume: str) -> None:
    """``--resume``: ``'auto'``, the latest checkpoint of the work dir; a path,
    that file."""
    if resume == 'auto':
        cfg.resume, cfg.load_from = True, None
        return
    if not osp.isfile(resume):
        raise ConfigError(f'--resume: checkpoint file not found: {resume}')
    cfg.resume, cfg.load_from = True, resume


def load_config(path: str,
                work_dir: Optional[str] = None,
                cfg_options: Optional[dict] = None,
                launcher: str = 'none',
                amp: bool = False,
                amp_dtype: Optional[str] = None,
                auto_scale_lr: bool = False,
                resume: Optional[str] = None,
                partial_load: bool = False) -> Config:
    """Read a config and apply the command-line semantics of mmdet's tools and
    what this machine needs.

    * ``work_dir``, ``cfg_options``, ``launcher``, ``auto_scale_lr`` as in
      mmdet's tools.
    * ``amp``: ``AmpOptimWrapper`` (fp16 with dynamic loss scale) on CUDA;
      ``amp_dtype`` (``'float16'`` or ``'bfloat16'``) sets its
      ``optim_wrapper.dtype``. Without CUDA, where mmengine's
      ``AmpOptimWrapper`` asserts a GPU, ``amp`` or an ``AmpOptimWrapper`` in
      the config becomes ``CPUAmpOptimWrapper`` (bf16 autocast, no loss scale;
      ``loss_scale`` / ``dtype`` are dropped).
    * a distributed run (``launcher`` not ``'none'``) without CUDA: SyncBN ->
      BN (SyncBN runs only on GPUs), gloo, DDP without device ids. A single
      process keeps the config's SyncBN: mmengine's Runner reverts it to BN
      when it wraps the model.
    * ``compile`` (mmengine's Runner option, ``torch.compile`` of
      ``train_step``): the optimizer wrapper is built by
      ``CompileOptimWrapperConstructor`` (plain ``dict`` param groups and
      foreach kernels, which dynamo can trace) unless the config names a
      constructor other than mmengine's default or
      ``MergedGroupsOptimWrapperConstructor``; ``EagerDataPreprocessorHook``
      keeps the data preprocessor out of the graph; ``StaticModuleIntsHook``
      traces the modules' int attributes as constants (torch < 2.6); on torch <
      2.4 shapes are static (``dynamic=False``; ``dynamic=True`` is a
      :class:`ConfigError`).
    * ``resume='auto'``: latest checkpoint of the work dir; a path: that file.
    * ``partial_load``: ``partial_load=True`` in the config: ``load_from`` may
      load a checkpoint that does not fit the model
      (``aa_det.engine.CheckpointCheckHook``).
    """
    cfg = _read_config(path)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(path))[0])
    if launcher != 'none' and not torch.cuda.is_available():
        _prepare_cpu_distributed(cfg)
    _prepare_amp(cfg, amp, amp_dtype)
    # as mmengine reads it: True or a dict, even empty
    if cfg.get('compile') not in (None, False):
        _prepare_compile(cfg, path)
    if auto_scale_lr:
        if ('auto_scale_lr' not in cfg
                or 'base_batch_size' not in cfg.auto_scale_lr):
            raise ConfigError(
                f'{path}: --auto-scale-lr needs auto_scale_lr.base_batch_size '
                f'in the config')
        cfg.auto_scale_lr.enable = True
    if resume is not None:
        _prepare_resume(cfg, resume)
    if partial_load:
        cfg.partial_load = True
    return cfg


def close_process_group():
    """End a finished distributed run (a no-op without one): a barrier, the
    default process group destroyed, and its gloo threads joined before the
    interpreter shuts down.

    A gloo worker thread frees a collective's tensors after the caller's wait
    has returned; a tensor that Python held needs the GIL to be freed, and a
    thread that asks for it while the interpreter finalises aborts the process
    (SIGABRT, "terminate called without an active exception"; torchrun then
    reports the finished run as failed). ``destroy_process_group`` only
    unregisters the group while the run's model (DDP) still holds it, so the
    finished runner, whose cycles keep it alive, is collected first; the last
    reference, dropped here, destroys the group with the GIL released (torch's
    binding), joining its threads. Called on success only, with the caller's
    runner released: after an error the other ranks may never reach the
    barrier."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    group = dist.group.WORLD
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()  # the finished runner and its DDP model
    del group  # the last reference: the gloo threads end here


def _name_refused_checkpoints(runner: Runner) -> None:
    """The Runner's ``load_checkpoint`` and ``resume`` (``load_from``,
    ``--resume``, ``tools/test.py``'s checkpoint) with a checkpoint that
    torch's safe loading refuses as one :class:`ConfigError` line naming the
    file and the converter, in a config without ``CheckpointCheckHook`` too
    (torch's own error: ``Unsupported global: ...HistoryBuffer`` among a page
    of advice)."""
    for name in ('load_checkpoint', 'resume'):
        method = getattr(runner, name)

        @functools.wraps(method)
        def loads(filename, *args, method=method, **kwargs):
            try:
                return method(filename, *args, **kwargs)
            # pickle's UnpicklingError, or torch's own
            except Exception as e:  # noqa: BLE001
                refused = refused_global(e)
                if refused is None:
                    raise
                raise unsafe_checkpoint_error(filename, refused) from None

        setattr(runner, name, loads)


def build_runner(cfg: Config, splits=('train', 'val', 'test')) -> Runner:
    """Check what must be checked before the model is built
    (``config_checks.py``: the backbone's settings, the neck's channels,
    mmpretrain's classification data of ``splits``), then build mmengine's
    Runner (or the config's runner_type). Everything else is checked by what
    the config names, as under mmdet's own tools; a checkpoint the Runner loads
    that torch's safe loading refuses is one line naming the converter
    (:func:`_name_refused_checkpoints`)."""
    check_run_config(cfg, splits)
    if cfg.get('launcher') == 'pytorch' and not torch.cuda.is_available(
    ) and not dist.is_initialized():
        # mmengine's init_dist calls torch.cuda.set_device, which fails without
        # a GPU; the Runner skips it when a process group exists, so start gloo
        # here (torchrun's env://).
        dist.init_process_group(backend='gloo')
    runner = Runner.from_cfg(
        cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    _name_refused_checkpoints(runner)
    return runner
