"""The supported stacks (torch 2.1 floor to the pinned torch 2.14): versions
checked, checkpoints carried between stacks, and the plugin installed into an
environment that already has the stack."""
import glob
import os
import os.path as osp
import re
import subprocess
import sys
import sysconfig

import pytest
from demo_config import DEMO, ROOT, demo_options

sys.path.insert(0, osp.join(ROOT, 'tools', 'env'))
import env_check  # noqa: E402

TRAIN, TEST = osp.join(ROOT, 'tools/train.py'), osp.join(ROOT, 'tools/test.py')
#: the other stack's interpreter (.ci/run sets it: each stack's run hands its
#: checkpoint to the other)
OTHER_PYTHON = os.environ.get('AA_DET_OTHER_PYTHON')
ENV = dict(os.environ, OMP_NUM_THREADS='1')
ONE_EPOCH = {
    'train_cfg.max_epochs': 1,
    'train_dataloader.batch_size': 4,
    'model.test_cfg.score_thr': 0.0
}


def run(python, *args, options=None, cwd=ROOT):
    cmd = [python, *map(str, args)]
    if options:
        cmd += ['--cfg-options'] + [f'{k}={v}' for k, v in options.items()]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=ENV, cwd=cwd)


def test_versions_outside_the_supported_range_are_one_line(
        capsys, monkeypatch):
    """env_check reads the installed aa_det's SUPPORTED_VERSIONS: a range the
    installed mmdet misses is one ``aa_det:`` line naming the version found and
    the range; AA_DET_ALLOW_UNSUPPORTED=1 warns."""
    env_check.check_versions()  # the running stack is supported
    supported = ('torch>=2.1,<2.15', 'mmdet>=9.0')  # a range nobody has
    with pytest.raises(SystemExit) as e:
        env_check.check_versions(supported)
    assert e.value.code == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert re.match(
        r'aa_det: mmdet 3\.3\.\d+ is outside the supported range >=9\.0 ',
        first), first
    monkeypatch.setenv('AA_DET_ALLOW_UNSUPPORTED', '1')
    env_check.check_versions(supported)
    assert capsys.readouterr().err.startswith('aa_det: warning: mmdet 3.3')


@pytest.mark.skipif(
    not OTHER_PYTHON,
    reason='needs the other stack: AA_DET_OTHER_PYTHON=<its venv>/bin/python '
    '(.ci/run sets it)')
def test_checkpoint_resumes_and_evaluates_on_the_other_stack(
        tiny_shapes, tmp_path):
    """A Runner checkpoint written on this stack (torch, numpy 1 or 2) resumes
    training and evaluates on the other one, through tools/train.py and
    tools/test.py."""
    options = demo_options(tiny_shapes, **ONE_EPOCH)
    out = run(
        sys.executable,
        TRAIN,
        DEMO,
        '--work-dir',
        tmp_path / 'here',
        options=options)
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = tmp_path / 'here' / 'epoch_1.pth'
    out = run(
        OTHER_PYTHON,
        TRAIN,
        DEMO,
        '--work-dir',
        tmp_path / 'there',
        '--resume',
        ckpt,
        options={
            **options, 'train_cfg.max_epochs': 2
        })
    assert out.returncode == 0, out.stderr[-3000:]
    log = open(glob.glob(str(tmp_path / 'there' / '*' / '*.log'))[0]).read()
    assert 'resumed epoch: 1' in log and re.search(r'Epoch\(train\)\s+\[2\]',
                                                   log)
    out = run(
        OTHER_PYTHON,
        TEST,
        DEMO,
        ckpt,
        '--work-dir',
        tmp_path / 'eval',
        options=options)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'coco/bbox_mAP' in out.stdout + out.stderr


def _user_env(tmp_path):
    """A venv holding this stack (torch, mmcv, mmengine, mmdet: this venv's
    site-packages on its path) but not aa_det: a user's existing MMDetection
    environment."""
    venv = tmp_path / 'user_env'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip',
                    str(venv)],
                   check=True)
    purelib = sysconfig.get_paths(vars={
        'base': str(venv),
        'platbase': str(venv)
    })['purelib']
    # a plain path line: the directory's own .pth files (this venv's editable
    # aa_det) are not read
    with open(osp.join(purelib, 'stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    return osp.join(venv, 'bin', 'python')


#: slow (34 s): every set-up installs the plugin with pip, and
#: test_detection.py trains our config with mmdet's own train entry; this is
#: the recipe's whole path in a venv of its own
@pytest.mark.slow
def test_install_into_an_existing_environment_and_train_with_mmdet_tools(
        tiny_shapes, tmp_path):
    """docs/setup.md's recipe: ``pip install --no-deps -e .`` into an
    environment that already has the stack, then our tools/train.py and mmdet's
    own tools/train.py (from the mmdet wheel) train our config, which imports
    the plugin through ``custom_imports``."""
    python = _user_env(tmp_path)
    # not there before the install
    assert run(python, '-c', 'import aa_det', cwd=tmp_path).returncode != 0
    out = run(sys.executable, '-m', 'pip', '--python', python, 'install', '-q',
              '--no-deps', '--no-build-isolation', '-e', ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    out = run(
        python,
        '-c',
        'import aa_det, sys; print(aa_det.__file__)',
        cwd=tmp_path)
    assert out.stdout.strip() == osp.join(ROOT, 'aa_det',
                                          '__init__.py'), out.stderr[-2000:]
    options = demo_options(tiny_shapes, **ONE_EPOCH,
                           **{'train_cfg.val_interval': 2})
    out = run(
        python,
        TRAIN,
        DEMO,
        '--work-dir',
        tmp_path / 'ours',
        options=options,
        cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert osp.isfile(tmp_path / 'ours' / 'epoch_1.pth')
    mmdet_train = run(
        python, '-c', 'import mmdet, os; '
        'print(os.path.join(os.path.dirname(mmdet.__file__), ".mim", "tools", '
        '"train.py"))').stdout.strip()
    out = run(
        python,
        mmdet_train,
        DEMO,
        '--work-dir',
        tmp_path / 'mmdet',
        options=options,
        cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert osp.isfile(tmp_path / 'mmdet' / 'epoch_1.pth')
