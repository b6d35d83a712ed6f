"""What ``load_config`` (tools/train.py, tools/test.py) changes in a config,
each change checked in the config it returns and, where the Runner reads it, in
what ``build_runner`` builds from it: a distributed run on the CPU, ``--amp``
on the CPU, mmengine's ``compile`` option, ``--resume`` and the command line's
own; and how the tools end a finished distributed run.

Covered elsewhere, not repeated here: a training step under ``--amp`` runs the
forward in bf16 autocast (test_user_paths.py), ``--amp-dtype`` on CUDA and
without ``--amp`` (test_user_paths.py), the hooks and ``dynamic`` that
``compile`` adds per torch version and its optimizer stepping under dynamo
(test_detection.py), a distributed run of two processes (test_detection.py,
slow), what ``--resume`` and ``--partial-load`` load (test_checkpoints.py)."""
import contextlib
import os
import os.path as osp
import re
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from config_runner import build_runner, close_process_group, load_config
from demo_config import DEMO, demo_options
from torch import nn

from aa_det.utils import ConfigError
from aa_det.utils.compat import TORCH_VERSION

CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason='the changes for a machine without CUDA')


@contextlib.contextmanager
def one_process_group(monkeypatch):
    """A gloo process group of this process alone, as torchrun's rank 0 of 1
    (its environment included: mmengine reads ``LOCAL_RANK``; what its Runner
    sets in a distributed run is restored after the test)."""
    for name in ('LOCAL_RANK', 'RANK'):
        monkeypatch.setenv(name, '0')
    monkeypatch.setenv('WORLD_SIZE', '1')
    for name in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'):
        monkeypatch.setenv(name, os.environ.get(name, '1'))
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        'gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@CPU_ONLY
def test_distributed_run_on_the_cpu_builds_ddp_with_bn(tiny_shapes, tmp_path,
                                                       monkeypatch):
    """``--launcher pytorch`` without CUDA: the demo's SyncBN becomes BN, the
    group gloo, and the Runner wraps the CPU model in DDP without device ids
    (mmengine's default, ``[LOCAL_RANK]``, fails on a CPU model)."""
    from mmengine.model import MMDistributedDataParallel
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes),
        launcher='pytorch')
    assert 'SyncBN' not in str(
        cfg.model) and cfg.model.backbone.norm_cfg.type == 'BN'
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert (cfg.model_wrapper_cfg.type,
            cfg.model_wrapper_cfg.device_ids) == ('MMDistributedDataParallel',
                                                  None)
    with one_process_group(monkeypatch):
        runner = build_runner(cfg)
        assert isinstance(
            runner.model,
            MMDistributedDataParallel) and runner.model.device_ids is None
        norms = [
            m for m in runner.model.module.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        ]
        assert norms and all(type(m) is nn.BatchNorm2d for m in norms)
    own = load_config(
        DEMO,
        launcher='pytorch',
        cfg_options={'model_wrapper_cfg': dict(type='MyWrapper')})
    # a config's own wrapper wins
    assert own.model_wrapper_cfg == dict(type='MyWrapper')


@CPU_ONLY
@pytest.mark.skipif(
    not osp.isdir('/proc/self/task'),
    reason="reads the process's threads from /proc")
def test_a_finished_distributed_run_joins_the_gloo_threads(
        tiny_shapes, tmp_path, monkeypatch):
    """What tools/train.py and tools/test.py do after a finished distributed
    run: ``close_process_group`` destroys the group and ends its threads while
    the interpreter is alive (a gloo thread left to free a collective's tensors
    during the interpreter's shutdown aborts the process)."""

    def threads():
        return set(os.listdir('/proc/self/task'))

    options = demo_options(
        tiny_shapes, **{
            'train_cfg.max_epochs': 1,
            'train_cfg.val_interval': 2
        })
    cfg = load_config(
        DEMO, work_dir=str(tmp_path), cfg_options=options, launcher='pytorch')
    before = threads()
    with one_process_group(monkeypatch):
        # the group's workers and its transport's loop
        gloo = threads() - before
        assert gloo
        # as the tools call it: the runner's own cycles keep it (and DDP) alive
        build_runner(cfg).train()
        close_process_group()
        assert not dist.is_initialized() and not gloo & threads()


@CPU_ONLY
def test_amp_optim_wrapper_of_a_config_runs_bf16_autocast_on_the_cpu(
        tiny_shapes, tmp_path):
    """mmengine's ``AmpOptimWrapper`` (which asserts a GPU) in a config, or
    ``--amp``: ``CPUAmpOptimWrapper`` without the GPU's ``loss_scale`` /
    ``dtype``; the wrapper the Runner builds enters bf16 CPU autocast and the
    parameters stay float32."""
    assert load_config(
        DEMO, amp=True).optim_wrapper.type == 'CPUAmpOptimWrapper'
    amp = {
        'optim_wrapper.type': 'AmpOptimWrapper',
        'optim_wrapper.loss_scale': 'dynamic',
        'optim_wrapper.dtype': 'float16'
    }
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes, **amp))
    assert cfg.optim_wrapper.type == 'CPUAmpOptimWrapper'
    assert ('loss_scale' not in cfg.optim_wrapper
            and 'dtype' not in cfg.optim_wrapper)
    runner = build_runner(cfg)
    wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    assert type(wrapper).__name__ == 'CPUAmpOptimWrapper'
    with wrapper.optim_context(runner.model):
        assert torch.is_autocast_cpu_enabled(
        ) and torch.get_autocast_cpu_dtype() == torch.bfloat16
    assert not torch.is_autocast_cpu_enabled()
    assert all(p.dtype == torch.float32 for p in runner.model.parameters())
    with pytest.raises(
            ConfigError,
            match="--amp-dtype must be 'float16' or 'bfloat16', not 'half'"):
        load_config(DEMO, amp=True, amp_dtype='half')


def test_compile_option_builds_plain_groups_and_foreach_sgd(
        tiny_shapes, tmp_path):
    """``compile=True`` (mmengine's Runner option): the Runner built from the
    config has ``EagerDataPreprocessorHook`` and ``StaticModuleIntsHook`` and
    an SGD with plain ``dict`` param groups and foreach kernels
    (``CompileOptimWrapperConstructor``), which dynamo can trace. Nothing is
    compiled."""
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options=demo_options(tiny_shapes, compile=True))
    assert cfg.optim_wrapper.constructor == 'CompileOptimWrapperConstructor'
    runner = build_runner(cfg)
    assert {'EagerDataPreprocessorHook', 'StaticModuleIntsHook'
            } <= {type(hook).__name__
                  for hook in runner.hooks}
    optimizer = runner.build_optim_wrapper(runner.optim_wrapper).optimizer
    assert isinstance(
        optimizer, torch.optim.SGD) and optimizer.defaults['foreach'] is True
    assert optimizer.param_groups and all(
        type(group) is dict for group in optimizer.param_groups)
    # the installed torch (test_detection.py sets both versions)
    if TORCH_VERSION < (2, 4):
        assert cfg.compile == dict(dynamic=False)


def test_a_config_without_custom_imports_is_refused_as_in_mmdet(tmp_path):
    """A config naming our types without ``custom_imports`` importing aa_det
    is refused by our tools in one line naming ``custom_imports`` (our
    tools import aa_det themselves: it would train here), as mmdet's tools
    refuse it (test below)."""
    path = tmp_path / 'no_imports.py'
    path.write_text(f'_base_ = {DEMO!r}\ncustom_imports = None\n')
    cfg = load_config(str(path), work_dir=str(tmp_path))
    with pytest.raises(
            ConfigError,
            match=r"no_imports.py names \w+, which `import aa_det` registers: "
            r"add custom_imports=dict\(imports=\['aa_det'\], "):
        build_runner(cfg)
    custom = tmp_path / 'custom.py'  # a module of aa_det's is enough
    custom.write_text(f'_base_ = {DEMO!r}\n'
                      "custom_imports = dict(imports=['aa_det.models'])\n")
    build_runner(load_config(str(custom), work_dir=str(tmp_path)))


MMDET_SIDE = """
import sys
from mmdet.apis import init_detector
from mmengine.config import Config
from mmengine.runner import Runner
assert 'aa_det' not in sys.modules
try:
    Runner.from_cfg(Config.fromfile(sys.argv[1]))
except KeyError as e:
    print('refused:', e)
cfg = Config.fromfile(sys.argv[2])  # its custom_imports import aa_det
runner = Runner.from_cfg(cfg)
wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
init_detector(cfg, device='cpu')
print(type(wrapper).__name__, type(wrapper.optimizer.param_groups[0]),
      sorted(type(hook).__name__ for hook in runner.hooks))
"""


def test_what_our_tools_dump_builds_in_mmdets_path(tiny_shapes, tmp_path):
    """In a fresh process with nothing but a config's ``custom_imports``
    (mmdet's tools/train.py: ``Config.fromfile``, ``Runner.from_cfg``), a
    config without them is refused (``KeyError``), and one our tools dumped
    after ``--amp`` and ``compile`` builds its Runner, optimizer wrapper and
    hooks, and loads in ``init_detector``: ``import aa_det`` registers every
    type it names."""
    path = tmp_path / 'no_imports.py'
    path.write_text(f'_base_ = {DEMO!r}\ncustom_imports = None\n'
                    f'work_dir = {str(tmp_path)!r}\n')
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        amp=True,
        cfg_options=demo_options(tiny_shapes, compile=True))
    cfg.dump(str(tmp_path / 'dumped.py'))
    out = subprocess.run([
        sys.executable, '-c', MMDET_SIDE,
        str(path),
        str(tmp_path / 'dumped.py')
    ],
                         capture_output=True,
                         text=True,
                         cwd=tmp_path,
                         env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused: 'AAResNet is not in the mmdet::model registry" \
        in out.stdout, out.stdout
    wrapper = 'AmpOptimWrapper' if torch.cuda.is_available() \
        else 'CPUAmpOptimWrapper'
    assert f"{wrapper} <class 'dict'>" in out.stdout, out.stdout
    assert "'EagerDataPreprocessorHook', " in out.stdout
    assert "'StaticModuleIntsHook'" in out.stdout


def test_resume(tmp_path):
    """``--resume`` alone: the work dir's latest checkpoint (``load_from``
    cleared); a path: that file, or one error naming it."""
    cfg = load_config(
        DEMO, resume='auto', cfg_options={'load_from': 'pretrained.pth'})
    assert (cfg.resume, cfg.load_from) == (True, None)
    checkpoint = tmp_path / 'epoch_1.pth'
    checkpoint.write_bytes(b'')
    cfg = load_config(DEMO, resume=str(checkpoint))
    assert (cfg.resume, cfg.load_from) == (True, str(checkpoint))
    missing = str(tmp_path / 'epoch_2.pth')
    with pytest.raises(
            ConfigError,
            match=re.escape(
                f'--resume: checkpoint file not found: {missing}')):
        load_config(DEMO, resume=missing)
    assert load_config(DEMO).resume is False


def test_command_line_settings(tmp_path):
    """``--work-dir`` (default: ``./work_dirs/<config name>``),
    ``--cfg-options``, ``--launcher``, ``--auto-scale-lr`` (which needs the
    config's base batch size), a missing config file."""
    cfg = load_config(DEMO)
    assert cfg.work_dir == osp.join('./work_dirs',
                                    osp.splitext(osp.basename(DEMO))[0])
    assert cfg.launcher == 'none' and cfg.auto_scale_lr.enable is False
    cfg = load_config(
        DEMO,
        work_dir=str(tmp_path),
        cfg_options={'train_cfg.max_epochs': 3},
        auto_scale_lr=True)
    assert (cfg.work_dir, cfg.train_cfg.max_epochs,
            cfg.auto_scale_lr.enable) == (str(tmp_path), 3, True)
    with pytest.raises(
            ConfigError,
            match='--auto-scale-lr needs auto_scale_lr.base_batch_size'):
        load_config(
            DEMO,
            cfg_options={'auto_scale_lr': dict(_delete_=True, enable=False)},
            auto_scale_lr=True)
    with pytest.raises(
            ConfigError,
            match=re.escape(f'config file not found: {tmp_path}/none.py')):
        load_config(str(tmp_path / 'none.py'))
