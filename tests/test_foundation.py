"""Registration, the subpackages' import direction, safe checkpoint loading
with a real mmengine Runner, environment errors."""
import ast
import os
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.runner import Runner
from tool_output import own_stderr
from tool_process import run_python
from torch.utils.data import Dataset

from aa_det.utils.compat import TORCH_VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_registers_into_mmdet_scope():
    # isort: off
    import aa_det  # noqa: F401
    from mmdet.registry import MODELS
    from mmengine.registry import MODELS as ROOT_MODELS
    # isort: on
    assert MODELS.get('AAResNet') is not None and MODELS.get(
        'GSAResNet') is not None
    # conv layers live where mmcv's build_conv_layer looks, from any scope
    assert ROOT_MODELS.get('AAConv') is not None and ROOT_MODELS.get(
        'GSA') is not None


#: aa_det's subpackages, each importing only from those before it
#: (docs/design.md, "Code layout")
LAYERS = ('utils', 'models', 'datasets', 'evaluation', 'engine')


def _aa_det_imports(path):
    """``(line, imported subpackage, inside a function)`` of every import of
    aa_det's subpackages in a module."""
    tree = ast.parse(open(path).read())
    nested = {
        id(n)
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in ast.walk(f)
    }
    # ['aa_det', 'models', 'layers']
    package = os.path.relpath(os.path.dirname(path), ROOT).split(os.sep)
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level +
                           1] if node.level else []
            names = ['.'.join(base + ([node.module] if node.module else []))]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split('.')
            if parts[0] == 'aa_det' and len(parts) > 1 and parts[1] in LAYERS:
                yield node.lineno, parts[1], id(node) in nested


def test_subpackages_import_in_one_direction():
    """Each subpackage imports aa_det's code only from itself and the layers
    before it, and never from inside a function (an import that dodges a
    loop)."""
    problems = []
    for package in LAYERS:
        for folder, _, files in os.walk(os.path.join(ROOT, 'aa_det', package)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith('.py'):
                    continue
                for line, imported, nested in _aa_det_imports(path):
                    if LAYERS.index(imported) > LAYERS.index(
                            package) or nested:
                        problems.append(
                            f'{os.path.relpath(path, ROOT)}:{line} imports '
                            f'aa_det.{imported}'
                            f'{" inside a function" if nested else ""}')
    assert not problems, problems


@pytest.mark.slow
def test_each_subpackage_imports_alone_in_a_fresh_interpreter():
    """Each subpackage imported first in an interpreter of its own (the
    interpreters run side by side)."""
    procs = {
        package:
        subprocess.Popen([sys.executable, '-c', f'import aa_det.{package}'],
                         stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE,
                         text=True,
                         cwd=ROOT)
        for package in LAYERS
    }
    errors = {
        package: proc.communicate()[1]
        for package, proc in procs.items()
    }
    failed = {
        package: errors[package][-1500:]
        for package, proc in procs.items() if proc.returncode
    }
    assert not failed, failed


def test_custom_imports_in_a_config_registers_in_a_fresh_process(tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(
        "default_scope = 'mmdet'\ncustom_imports = dict(imports=['aa_det'], "
        "allow_failed_imports=False)\nmodel = dict(type='GSAResNet', "
        "depth=26)\n")
    code = ((
        'import sys; from mmengine.config import Config; from '
        'mmengine.registry import init_default_scope;from mmdet.registry '
        'import MODELS; cfg = '
        'Config.fromfile(sys.argv[1]);init_default_scope(cfg.default_scope); '
        'm = MODELS.build(cfg.model);assert "aa_det" in sys.modules; '
        'print(type(m).__name__)'))
    out = subprocess.run(
        [sys.executable, '-c', code, str(cfg)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'GSAResNet'


class ToyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, labels, mode='tensor'):
        out = self.linear(torch.stack(inputs))
        if mode == 'loss':
            return dict(
                loss=(out.squeeze(1) - torch.stack(labels)).pow(2).mean())
        return out


class ToyDataset(Dataset):

    def __len__(self):
        return 12

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return dict(
            inputs=torch.randn(2, generator=g), labels=torch.tensor(1.0))


def _runner(work_dir, max_epochs, resume, load_from=None, safe=True):
    # a MessageHub each
    return Runner(
        model=ToyModel(),
        work_dir=str(work_dir),
        experiment_name=f'{work_dir}-{max_epochs}-{resume}',
        train_dataloader=dict(
            dataset=ToyDataset(),
            batch_size=3,
            num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=True)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9)),
        param_scheduler=dict(
            type='MultiStepLR', milestones=[1], by_epoch=True, begin=0,
            end=10),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=1),
            check_checkpoint=dict(type='CheckpointCheckHook'),
            **(dict(safe_checkpoint=dict(
                type='SafeCheckpointHook')) if safe else {})),
        resume=resume,
        load_from=load_from,
        default_scope='mmdet')


def test_runner_checkpoints_load_safely_and_resume(tmp_path):
    """With ``SafeCheckpointHook`` (as ``configs/_base_/default_runtime.py``
    names it) a real Runner's checkpoint holds nothing torch's safe unpickler
    refuses: ``torch.load(weights_only=True)`` reads it with nothing allowed,
    and resume restores the MessageHub's histories and the schedule. A
    checkpoint of a Runner without the hook is refused (``HistoryBuffer``) and
    ``tools/convert_checkpoint.py`` makes it one that resumes the same way."""
    # isort: off
    import aa_det  # noqa: F401  registers the hooks
    from mmengine.logging import HistoryBuffer
    # isort: on
    _runner(tmp_path, 1, False).train()
    ckpt = torch.load(
        tmp_path / 'epoch_1.pth', map_location='cpu', weights_only=True)
    loss = ckpt['message_hub']['log_scalars']['train/loss']
    assert len(loss['log_history']) == 4 and loss['max_length'] > 0
    runner = _runner(tmp_path, 2, True)
    runner.train()
    assert runner.iter == 8 and runner.epoch == 2
    # schedule state resumed
    assert runner.optim_wrapper.get_lr()['lr'][0] == pytest.approx(0.001)
    history = runner.message_hub.get_scalar('train/loss')
    # epoch 1's 4 losses resumed
    assert isinstance(history, HistoryBuffer) and len(history.data[0]) == 8

    # a Runner without the hook writes HistoryBuffer objects
    plain = tmp_path / 'plain'
    _runner(plain, 1, False, safe=False).train()
    if TORCH_VERSION >= (2, 6):
        with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
            torch.load(
                plain / 'epoch_1.pth', map_location='cpu', weights_only=True)
    out = run_python([
        os.path.join(ROOT, 'tools', 'convert_checkpoint.py'),
        plain / 'epoch_1.pth', plain / 'converted.pth'
    ],
                     cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    converted = torch.load(
        plain / 'converted.pth', map_location='cpu', weights_only=True)
    losses = converted['message_hub']['log_scalars']['train/loss'][
        'log_history'].tolist()
    resumed = _runner(
        tmp_path / 'resumed', 2, True, load_from=str(plain / 'converted.pth'))
    resumed.train()
    history = resumed.message_hub.get_scalar('train/loss').data[0].tolist()
    assert resumed.iter == 8 and len(losses) == 4 and len(
        history) == 8 and history[:4] == losses


@pytest.mark.slow
def test_import_changes_no_other_library():
    """``import aa_det`` registers modules and leaves mmengine's checkpoint
    loading as it was."""
    code = (('from mmengine.runner.checkpoint import CheckpointLoader as C, '
             'load_from_local as f\nbefore = dict(C._schemes)\nimport aa_det\n'
             'assert C._schemes == before and C._schemes[""] is f\n'))
    out = subprocess.run([sys.executable, '-c', code],
                         capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_tools_fail_clearly_outside_the_environment(tmp_path):
    """A Python without torch: one line saying what's wrong and the command
    that fixes it."""
    env = dict(os.environ, PYTHONPATH='', PYTHONNOUSERSITE='1')
    bare = tmp_path / 'bare'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip',
                    str(bare)],
                   check=True)
    out = subprocess.run([
        str(bare / 'bin' / 'python'),
        os.path.join(ROOT, 'tools', 'train.py'), 'x.py'
    ],
                         capture_output=True,
                         text=True,
                         env=env)
    assert out.returncode == 2
    assert "required package 'torch' is not installed" in out.stderr
    assert ('bash tools/env/setup_env.sh' in out.stderr
            and 'Traceback' not in out.stderr)


@pytest.mark.parametrize('tool, args', [
    ('train.py', ['configs/nope.py']),
    ('test.py', ['configs/nope.py', 'nope.pth']),
    ('test.py', [
        'configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py',
        'missing.pth'
    ]),
    ('train.py', [
        'configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py',
        '--resume', 'missing.pth'
    ]),
])
def test_tools_report_bad_config_in_one_line(tool, args, tmp_path):
    """A missing config or checkpoint: exit 2, one `aa_det:` line naming it, no
    traceback."""
    out = run_python(
        [os.path.join(ROOT, 'tools', tool), *args, '--work-dir', tmp_path],
        cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert 'Traceback' not in out.stderr, out.stderr[-2000:]
    own = own_stderr(out.stderr)
    assert own.startswith('aa_det: ') and own.count('\n') == 1 and (
        'nope.py' in own or 'missing.pth' in own), own
