"""Config loading and Runner construction shared by tools/train.py and tools/test.py."""
import os.path as osp
from typing import Optional

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.model import is_model_wrapper
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..evaluation.bn_statistics import shared_head_norms
from ..utils.compat import TORCH_VERSION
from .checkpoints import check_checkpoint_fits, check_run_checkpoint
from ..utils.errors import ConfigError
from .checks import check_run_config


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
    """Make mmengine's ``compile`` option (``torch.compile`` of ``train_step``) run: an optimizer
    step dynamo can trace, the data preprocessor outside the graph, the modules' ints constant and,
    on torch < 2.4, static shapes (docs/design.md, "Compiling and exporting")."""
    if cfg.get('optim_wrapper') is not None and cfg.optim_wrapper.get('constructor', 'DefaultOptimWrapperConstructor') \
            in ('DefaultOptimWrapperConstructor', 'MergedGroupsOptimWrapperConstructor'):
        cfg.optim_wrapper.constructor = 'CompileOptimWrapperConstructor'
    hooks = list(cfg.get('custom_hooks') or [])
    types = {hook.get('type') for hook in hooks}
    cfg.custom_hooks = hooks + [dict(type=name) for name in ('EagerDataPreprocessorHook', 'StaticModuleIntsHook')
                                if name not in types]
    if TORCH_VERSION < (2, 4):
        compile_cfg = dict(cfg.compile) if isinstance(cfg.compile, dict) else {}
        if compile_cfg.get('dynamic'):
            raise ConfigError(f'{path}: compile.dynamic=True needs torch >= 2.4 (this is torch {torch.__version__}, whose '
                              "dynamo stops at symbolic sizes in mmdet's FocalLoss and in the attention kernels); "
                              'set compile.dynamic=False (one compile per input size)')
        compile_cfg['dynamic'] = False  # torch 2.1 turns a second size dynamic, where it stops as above
        cfg.compile = compile_cfg


def load_config(path: str, work_dir: Optional[str] = None, cfg_options: Optional[dict] = None,
                launcher: str = 'none', amp: bool = False, amp_dtype: Optional[str] = None,
                auto_scale_lr: bool = False,
                resume: Optional[str] = None, partial_load: bool = False) -> Config:
    """Read a config and apply the command-line semantics of mmdet's tools.

    * ``launcher='none'`` or no CUDA: SyncBN -> BN (SyncBN runs only on GPUs in
      a process group).
    * no CUDA: distributed runs on the CPU (gloo, DDP without device ids).
    * ``amp``: ``AmpOptimWrapper`` (fp16 with dynamic loss scale) on CUDA; ``amp_dtype``
      (``'float16'`` or ``'bfloat16'``) sets its ``optim_wrapper.dtype``.
      Without CUDA, where mmengine's ``AmpOptimWrapper`` asserts a GPU, ``amp``
      or an ``AmpOptimWrapper`` in the config becomes ``CPUAmpOptimWrapper``
      (bf16 autocast, no loss scale; ``loss_scale`` / ``dtype`` are dropped).
    * ``FocalLoss`` in the model becomes ``Float32FocalLoss`` (the same loss; bf16 logits are
      cast to float32, which mmcv's CUDA kernel needs).
    * ``CocoMetric`` in the val / test evaluators becomes ``LenientCocoMetric``
      (the same metric; it also accepts annotation files without ``info``).
    * ``CocoDataset`` in the dataloaders becomes ``CheckedCocoDataset`` (the same
      dataset; it names the file of a JSON syntax error, logs the annotations it
      skips and checks that its images exist).
    * ``compile`` (mmengine's Runner option, ``torch.compile`` of ``train_step``): the optimizer
      wrapper is built by ``CompileOptimWrapperConstructor`` (plain ``dict`` param groups and
      foreach kernels, which dynamo can trace) unless the config names a constructor other than mmengine's
      default or ``MergedGroupsOptimWrapperConstructor``;
      ``EagerDataPreprocessorHook`` keeps the data preprocessor out of the graph;
      ``StaticModuleIntsHook`` traces the modules' int attributes as constants (torch < 2.6); on
      torch < 2.4 shapes are static (``dynamic=False``; ``dynamic=True`` is a :class:`ConfigError`).
    * ``resume='auto'``: latest checkpoint of the work dir; a path: that file.
    * ``partial_load``: ``partial_load=True`` in the config: ``load_from`` may
      load a checkpoint that does not fit the model (see :func:`build_runner`).
    """
    if not osp.isfile(path):
        raise ConfigError(f'config file not found: {path}')
    try:
        cfg = Config.fromfile(path)
    except ModuleNotFoundError as e:  # mmengine: a package scope's base (mmpretrain::) whose package is missing
        hint = ': pip install mmpretrain==1.2.0 model-index (docs/setup.md)' if 'mmpretrain' in str(e) else ''
        raise ConfigError(f'{path}: {e}{hint}') from None
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(path))[0])
    if launcher == 'none' or not torch.cuda.is_available():
        _replace_type(cfg.model, 'SyncBN', 'BN')
    if not torch.cuda.is_available() and cfg.get('env_cfg', {}).get('dist_cfg'):
        cfg.env_cfg.dist_cfg.backend = 'gloo'
    if launcher != 'none' and not torch.cuda.is_available() and cfg.get('model_wrapper_cfg') is None:
        # mmengine passes device_ids=[LOCAL_RANK], which DDP rejects for a CPU model;
        # a config value wins over the Runner's default arguments.
        cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None,
                                     broadcast_buffers=False,
                                     find_unused_parameters=cfg.get('find_unused_parameters', False))
    if amp_dtype is not None:
        if not amp:
            raise ConfigError(f'--amp-dtype {amp_dtype} needs --amp')
        if amp_dtype not in ('float16', 'bfloat16'):
            raise ConfigError(f"--amp-dtype must be 'float16' or 'bfloat16', not {amp_dtype!r}")
    if amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        if torch.cuda.is_available():
            cfg.optim_wrapper.loss_scale = 'dynamic'
            if amp_dtype is not None:
                cfg.optim_wrapper.dtype = amp_dtype
    if not torch.cuda.is_available() and cfg.get('optim_wrapper', {}).get('type') == 'AmpOptimWrapper':
        for key in ('loss_scale', 'dtype', 'use_fsdp'):
            cfg.optim_wrapper.pop(key, None)
        cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
    if cfg.get('compile') not in (None, False):  # as mmengine reads it: True or a dict, even empty
        _prepare_compile(cfg, path)
    _replace_type(cfg.model, 'FocalLoss', 'Float32FocalLoss')
    for name in ('val_evaluator', 'test_evaluator'):
        _replace_type(cfg.get(name), 'CocoMetric', 'LenientCocoMetric')
    for split in ('train', 'val', 'test'):
        _replace_type(cfg.get(f'{split}_dataloader'), 'CocoDataset', 'CheckedCocoDataset')
    if auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ConfigError(f'{path}: --auto-scale-lr needs auto_scale_lr.base_batch_size in the config')
        cfg.auto_scale_lr.enable = True
    if resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif resume is not None:
        if not osp.isfile(resume):
            raise ConfigError(f'--resume: checkpoint file not found: {resume}')
        cfg.resume, cfg.load_from = True, resume
    if partial_load:
        cfg.partial_load = True
    return cfg


def shared_head_norm_warning(model) -> Optional[str]:
    """One line naming the dense head whose forward applies its BatchNorms to every FPN level
    (mmdet's ``RetinaHead`` with a BN ``norm_cfg``), what that costs at evaluation and the fix;
    ``None`` when no head does (:func:`aa_det.evaluation.bn_statistics.shared_head_norms`)."""
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


def close_process_group():
    """End a finished distributed run: a barrier, then the default process group destroyed (a no-op
    without one).

    A gloo worker thread releases a collective's tensors after the caller's wait has returned, and needs
    the GIL for it; if the interpreter is finalising by then, the process aborts (SIGABRT, "terminate called
    without an active exception"; seen on torch 2.14.1) and torchrun reports the finished run as failed.
    The barrier's wait releases the GIL until every earlier collective is done and its thread free.
    Called on success only: after an error the other ranks may never reach the barrier."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build_runner(cfg: Config, splits=('train', 'val', 'test')) -> Runner:
    """Check the data of ``splits`` and the checkpoint paths, then build mmengine's Runner
    (or the config's runner_type).

    The checkpoint the run will load (``load_from``, ``resume``) is read and checked
    first (:mod:`aa_det.engine.checkpoints`): readable, finite, and, once the model
    is built, fitting it: exactly for ``resume`` and for testing (``splits`` without
    ``'train'``), up to the heads' classification layers for ``load_from`` in
    training, anything with ``partial_load=True``. An auto-resume whose latest
    checkpoint is unusable resumes from the newest usable one. A dense head that shares its
    BatchNorms across FPN levels is named in one warning (:func:`shared_head_norm_warning`).
    """
    check_run_config(cfg, splits)
    checkpoint = check_run_checkpoint(cfg)
    if cfg.get('launcher') == 'pytorch' and not torch.cuda.is_available() and not dist.is_initialized():
        # mmengine's init_dist calls torch.cuda.set_device, which fails without a GPU; the
        # Runner skips it when a process group exists, so start gloo here (torchrun's env://).
        dist.init_process_group(backend='gloo')
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    warning = shared_head_norm_warning(model)
    if warning:
        runner.logger.warning(warning)
    if checkpoint is not None:
        path, loaded, note = checkpoint
        if note:
            runner.logger.warning(note)
        check_checkpoint_fits(cfg, model, path, loaded, training='train' in splits)
    return runner
