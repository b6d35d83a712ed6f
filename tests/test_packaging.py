"""The package as a user installs it: a wheel that carries the configs, tools,
demo scripts and model index in ``aa_det/.mim`` (as OpenMMLab packages do),
installs into an MMDetection environment without changing its torch,
torchvision, mmcv, mmengine or mmdet, and trains the demo config with mmdet's
own tools/train.py from an empty directory (docs/setup.md)."""
import ast
import glob
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import packages_distributions

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.join(ROOT, 'tools', 'env'))
import env_check  # noqa: E402

#: the packages of the user's environment that installing aa_det must leave
STACK = ('torch', 'torchvision', 'mmcv', 'mmengine', 'mmdet')
#: what setup.py reads to build the wheel; the rest of the checkout stays out
SOURCES = ('setup.py', 'MANIFEST.in', 'LICENSE', 'README.md',
           'model-index.yml', 'requirements', 'aa_det', 'configs', 'tools',
           'demo')
PAPERS = {
    'aa': 'https://arxiv.org/abs/1904.09925',
    'gsa': 'https://arxiv.org/abs/2010.03019'
}
#: docs/setup.md's commands for a user of the wheel, after its install line
USER_COMMANDS = (
    "AA=$(python -c 'import aa_det, os; "
    "print(os.path.dirname(aa_det.__file__))')/.mim",
    "MMDET=$(python -c 'import mmdet, os; "
    "print(os.path.dirname(mmdet.__file__))')/.mim",
    'python $AA/demo/synthetic_shapes.py',
    'python $MMDET/tools/train.py '
    '$AA/configs/retinanet/retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py',
)


def _version_file():
    namespace = {}
    with open(osp.join(ROOT, 'aa_det', 'version.py')) as f:
        exec(f.read(), namespace)
    return namespace


def _requirements(name):
    with open(osp.join(ROOT, 'requirements', name)) as f:
        lines = [line.split('#')[0].strip() for line in f]
    return [Requirement(line) for line in lines if line]


def _configs():
    """The configs under configs/, bases excluded, as paths from the root."""
    return sorted(
        osp.relpath(p, ROOT).replace(os.sep, '/')
        for p in glob.glob(osp.join(ROOT, 'configs', '*', '*.py'))
        if '_base_' not in p)


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    """The wheel ``pip wheel .`` builds, from a copy of the sources (an
    in-tree build would put copies into the checkout's aa_det/.mim, where
    the editable install keeps links)."""
    src = tmp_path_factory.mktemp('src')
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '.mim')
    for name in SOURCES:
        path = osp.join(ROOT, name)
        if osp.isdir(path):
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy(path, src / name)
    dist = tmp_path_factory.mktemp('dist')
    out = subprocess.run([
        sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
        '--no-build-isolation', '--no-index', '-w',
        str(dist),
        str(src)
    ],
                         capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    (path, ) = glob.glob(str(dist / '*.whl'))
    return path


def _metadata(wheel):
    """(version, install requirements, {extra: requirements}) of a wheel."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist()
                    if n.endswith('.dist-info/METADATA'))
        text = z.read(name).decode()
    version = re.search(r'^Version: (.+)$', text, re.M).group(1)
    install, extras = [], {}
    for line in re.findall(r'^Requires-Dist: (.+)$', text, re.M):
        req = Requirement(line)
        extra = re.search(r'extra == "(\w+)"', str(req.marker or ''))
        if extra:
            req.marker = None
            extras.setdefault(extra.group(1), []).append(req)
        else:
            install.append(req)
    return version, install, extras


def test_wheel_carries_configs_tools_demo_and_model_index(wheel):
    """Every config with its metafile, the Python tools, the demo scripts
    and the model index lie in aa_det/.mim; the license in the metadata."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    mim = {
        n[len('aa_det/.mim/'):]
        for n in names if n.startswith('aa_det/.mim/')
    }
    expected = set(_configs()) | {
        'model-index.yml', 'configs/retinanet/metafile.yml',
        'configs/imagenet/metafile.yml', 'configs/cifar/metafile.yml',
        'configs/_base_/default_runtime.py', 'tools/train.py', 'tools/test.py',
        'tools/env/env_check.py', 'demo/synthetic_shapes.py',
        'demo/detection_demo.py'
    }
    assert expected <= mim, sorted(expected - mim)
    assert not [n for n in mim if n.endswith('.sh')]  # checkout scripts
    assert not [n for n in names if n.startswith(('tests/', 'benchmarks/'))]
    assert any(
        n.endswith('.dist-info/licenses/LICENSE')
        or n.endswith('.dist-info/LICENSE') for n in names)


def test_one_version_and_no_stack_requirement(wheel):
    """The wheel's version is aa_det/version.py's; it requires none of the
    stack (pip would replace the environment's builds) and nothing optional:
    the OpenMMLab packages are the ``mim`` extra (requirements/mminstall.txt),
    mmpretrain ``cls``, plotting and TensorBoard ``vis``."""
    version, install, extras = _metadata(wheel)
    assert version == _version_file()['__version__']
    assert osp.basename(wheel).startswith(f'aa_det-{version}-')
    names = {canonicalize_name(r.name) for r in install}
    optional = set(STACK) | {
        'mmpretrain', 'model-index', 'matplotlib', 'tensorboard', 'psutil'
    }
    assert not names & optional, names & optional
    assert ({str(r)
             for r in extras['mim']
             } == {str(r)
                   for r in _requirements('mminstall.txt')})
    assert {r.name for r in extras['cls']} == {'mmpretrain', 'model-index'}
    assert {r.name for r in extras['vis']} == {'matplotlib', 'tensorboard'}


def test_install_requirements_are_imported():
    """Each install requirement is a module that the packaged code (aa_det,
    tools, demo) imports: nothing unused is installed."""
    imported = set()
    for folder in ('aa_det', 'tools', 'demo'):
        for path in glob.glob(
                osp.join(ROOT, folder, '**', '*.py'), recursive=True):
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split('.')[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split('.')[0])
    providers = {
        canonicalize_name(dist)
        for module, dists in packages_distributions().items()
        if module in imported for dist in dists
    }
    for req in _requirements('runtime.txt'):
        assert canonicalize_name(req.name) in providers, req.name


def test_dry_run_install_changes_nothing_of_the_stack(wheel):
    """``pip install --dry-run`` of the wheel with its extras into this
    environment (CI runs it on each tested stack, torch 2.1 included), from
    no index: everything it needs is installed, and it installs aa_det only."""
    report = osp.join(osp.dirname(wheel), 'report.json')
    out = subprocess.run([
        sys.executable, '-m', 'pip', 'install', '-q', '--dry-run',
        '--no-index', '--report', report, f'{wheel}[mim,cls,vis]'
    ],
                         capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(report) as f:
        installs = [
            canonicalize_name(i['metadata']['name'])
            for i in json.load(f)['install']
        ]
    assert installs == ['aa-det'], installs


def test_supported_versions_in_one_place():
    """env_check reads the ranges from the installed package's version.py;
    mminstall.txt repeats the OpenMMLab ones; each tested stack's pins lie in
    them; setup.py reads the version from version.py."""
    import aa_det
    supported = _version_file()['SUPPORTED_VERSIONS']
    assert env_check.supported_versions() == supported
    assert aa_det.__version__ == _version_file()['__version__']
    ranges = {Requirement(s).name: Requirement(s).specifier for s in supported}
    assert set(ranges) == set(STACK)
    assert ({r.name: r.specifier
             for r in _requirements('mminstall.txt')
             } == {k: v
                   for k, v in ranges.items() if k.startswith('mm')})
    for path in glob.glob(osp.join(ROOT, 'requirements', 'constraints*.txt')):
        with open(path) as f:
            pins = dict(
                line.split('#')[0].strip().split('==') for line in f
                if '==' in line.split('#')[0])
        for name, spec in ranges.items():
            assert spec.contains(pins[name]), (path, name, pins[name])
    with open(osp.join(ROOT, 'setup.py')) as f:
        assert not re.search(r"version\s*=\s*['\"]", f.read())


def test_metafile_names_every_config_with_its_paper():
    """model-index.yml imports one metafile per config folder; each config
    under configs/ is one model there, with its config path, its paper (AA's
    for the aa- configs and the AA recipe's baselines, GSA's for the gsa-
    configs and the GSA recipe's), its architecture, and no weights."""
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        imports = yaml.safe_load(f)['Import']
    models, collections = [], {}
    for path in imports:
        with open(osp.join(ROOT, path)) as f:
            meta = yaml.safe_load(f)
        for c in meta['Collections']:
            assert c['Name'] not in collections
            assert osp.isfile(osp.join(ROOT, c['README']))
            collections[c['Name']] = c
        models += meta['Models']
    assert sorted(m['Config'] for m in models) == _configs()
    for m in models:
        name = osp.splitext(osp.basename(m['Config']))[0]
        assert m['Name'] == name and m['In Collection'] in collections
        assert 'Weights' not in m and 'Results' not in m, name
        assert m['Metadata']['Architecture'], name
        kind = re.search(r'(?:^|_)(aa|gsa)-', name)
        if kind:
            assert m['Paper']['URL'] == PAPERS[kind.group(1)], name
        else:
            assert m['Paper']['URL'] in PAPERS.values(), name


def test_import_needs_no_optional_package(tmp_path):
    """``import aa_det`` (a config's custom_imports) registers every backbone
    without mmpretrain or TensorBoard: they are extras."""
    code = ('import sys\n'
            'for name in ("mmpretrain", "modelindex", "tensorboard"):\n'
            '    sys.modules[name] = None\n'
            'import aa_det\n'
            'from mmdet.registry import MODELS\n'
            'for t in ("AAResNet", "GSAResNet", "WideResNet"):\n'
            '    assert MODELS.get(t), t\n')
    out = subprocess.run([sys.executable, '-c', code],
                         capture_output=True,
                         text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]


def test_docs_give_the_wheel_users_commands():
    """docs/setup.md shows the commands the slow test below runs."""
    with open(osp.join(ROOT, 'docs', 'setup.md')) as f:
        lines = {line.split('  #')[0].strip() for line in f}
    missing = [c for c in USER_COMMANDS if c not in lines]
    assert not missing, missing


def _user_env(tmp_path):
    """A venv that sees this environment's packages (a path line to its
    site-packages) but not aa_det, whose editable install's .pth files that
    line does not read: an existing MMDetection environment."""
    venv = tmp_path / 'user_env'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip',
                    str(venv)],
                   check=True)
    paths = sysconfig.get_paths(vars={
        'base': str(venv),
        'platbase': str(venv)
    })
    with open(osp.join(paths['purelib'], 'stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    return venv


#: slow (1-2 min on 2 cores): a real install, the data and a short training
@pytest.mark.slow
def test_wheel_user_trains_the_demo_with_mmdet_tools(wheel, tmp_path):
    """docs/setup.md's commands: the wheel installs into an environment that
    has the stack (and no aa_det) changing nothing else; in an empty
    directory the installed generator writes the demo data and mmdet's
    tools/train.py trains the installed demo config."""
    venv = _user_env(tmp_path)
    python = str(venv / 'bin' / 'python')
    assert subprocess.run([python, '-c', 'import aa_det'],
                          cwd=tmp_path,
                          capture_output=True).returncode != 0
    report = tmp_path / 'report.json'
    out = subprocess.run([
        sys.executable, '-m', 'pip', '--python', python, 'install', '-q',
        '--no-index', '--report',
        str(report), wheel
    ],
                         capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    installs = [
        i['metadata']['name']
        for i in json.loads(report.read_text())['install']
    ]
    assert [canonicalize_name(n) for n in installs] == ['aa-det']
    work = tmp_path / 'empty'
    work.mkdir()
    short = ('train_cfg.max_epochs=1 train_dataloader.dataset.indices=16 '
             'val_dataloader.dataset.indices=8 '
             'train_dataloader.persistent_workers=False '
             'val_dataloader.persistent_workers=False')
    script = '\n'.join(('set -e', *USER_COMMANDS[:-1],
                        f'{USER_COMMANDS[-1]} --cfg-options {short}',
                        'python -c "import aa_det; print(aa_det.__file__)"'))
    env = dict(
        os.environ,
        PATH=f'{venv / "bin"}{os.pathsep}'
        f'{os.environ["PATH"]}',
        OMP_NUM_THREADS='1')
    env.pop('PYTHONPATH', None)
    out = subprocess.run(['bash', '-c', script],
                         capture_output=True,
                         text=True,
                         cwd=work,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1].startswith(str(venv))
    assert (work / 'data' / 'shapes' / 'annotations' /
            'instances_train.json').is_file()
    name = 'retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes'
    assert (work / 'work_dirs' / name / 'epoch_1.pth').is_file()
