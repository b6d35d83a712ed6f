"""tools/env/setup_env.sh run as a user runs it, with fake tools on PATH;
tools/env/env_check.py's CUDA check.

Nothing here downloads, builds or touches the real venv: the script runs
against a "shadow" venv, a directory whose bin/python forwards to this venv's
Python (so torch is found) but refuses ``-m pip`` (exit 97) or hands it to a
fake pip, with its own stamp file and an empty wheel cache.
"""
import glob
import hashlib
import importlib.util
import os
import os.path as osp
import subprocess
import sys
import time

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SCRIPT = osp.join(ROOT, 'tools', 'env', 'setup_env.sh')
PIP_REFUSED = 97


def _torch_version_file():
    """torch's version.py values (__version__, cuda) without importing
    torch."""
    spec = importlib.util.find_spec('torch')
    ns = {}
    with open(osp.join(osp.dirname(spec.origin), 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__'], ns['cuda']


TORCH_VER, TORCH_CUDA = _torch_version_file()
PY_TAG = 'cp%d%d' % sys.version_info[:2]
#: the pins this venv was set up with: $AA_DET_CONSTRAINTS where the run sets
#: it (another stack, as setup_env.sh reads it), else the tested stack whose
#: torch pin this torch is (constraints.txt, constraints-torch2.1.txt or
#: constraints-torch2.4.txt)
CONSTRAINTS = osp.realpath(os.environ['AA_DET_CONSTRAINTS']) if os.environ.get(
    'AA_DET_CONSTRAINTS') else next(
        (path for path in sorted(
            glob.glob(osp.join(ROOT, 'requirements', 'constraints*.txt')))
         if f'torch=={TORCH_VER.split("+")[0]}\n' in open(path).read()), None)
if CONSTRAINTS is None:
    pytest.skip(
        f'no constraints file pins torch {TORCH_VER}: set AA_DET_CONSTRAINTS '
        f'to the one this venv was set up with',
        allow_module_level=True)
#: the C++ standard the script builds mmcv with: torch's extension builder's
#: (c++20 for 2.14, c++17 for 2.1)
CXX_STD = ('c++20' if '-std=c++20' in open(
    osp.join(
        osp.dirname(importlib.util.find_spec('torch').origin), 'utils',
        'cpp_extension.py')).read() else 'c++17')
MMCV_VER = next(
    line.split('==')[1].strip() for line in open(CONSTRAINTS)
    if line.startswith('mmcv=='))


def _write_exe(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return path


def _key(index_url=''):
    """The script's stamp key (mirrors its KEY line: constraints, setup.py, the
    requirement files of its install, the script, index url)."""
    h = hashlib.sha256()
    reqs = [
        osp.join(ROOT, 'requirements', f'{name}.txt')
        for name in ('runtime', 'mminstall', 'cls', 'vis', 'tests')
    ]
    for p in (CONSTRAINTS, osp.join(ROOT, 'setup.py'), *reqs, SCRIPT):
        with open(p, 'rb') as f:
            h.update(f.read())
    h.update(index_url.encode() + b'\n')
    return h.hexdigest()[:16]


@pytest.fixture
def sandbox(tmp_path):
    """A shadow venv, an empty wheel cache, a fake-bin dir first on PATH, and a
    clean environment."""
    venv, cache, fakebin = (tmp_path / 'venv', tmp_path / 'cache',
                            tmp_path / 'bin')
    (venv / 'bin').mkdir(parents=True)
    cache.mkdir()
    fakebin.mkdir()
    _write_exe(venv / 'bin' / 'python', f"""#!/bin/sh
if [ "$1 $2" = "-m pip" ] && [ -n "$FAKE_PIP" ]; then shift 2; exec "{sys.executable}" "$FAKE_PIP" "$@"; fi
case "$*" in *"-m pip"*) echo "shadow venv: pip must not run here" >&2; exit {PIP_REFUSED};; esac
if [ -n "$FAKE_PY_INCLUDE" ]; then case "$*" in *sysconfig*)
  "{sys.executable}" "$@" | sed "s#[^ ]*\\$#$FAKE_PY_INCLUDE#"; exit;; esac; fi
exec "{sys.executable}" "$@"
""")  # noqa: E501
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith('AA_DET_') and k not in ('CUDA_HOME', 'CUDA_PATH',
                                                     'TORCH_CUDA_ARCH_LIST',
                                                     'CXX', 'FAKE_PY_INCLUDE',
                                                     'FAKE_PIP')
    }
    env.update(
        AA_DET_VENV=str(venv),
        AA_DET_CACHE=str(cache),
        AA_DET_CONSTRAINTS=CONSTRAINTS,
        PIP_NO_INDEX='1',
        PATH=f'{fakebin}:{os.environ["PATH"]}')

    class Sandbox:
        pass

    box = Sandbox()
    box.venv, box.cache, box.bin, box.env, box.tmp = (venv, cache, fakebin,
                                                      env, tmp_path)

    def run(**extra):
        t0 = time.time()
        out = subprocess.run(['bash', SCRIPT],
                             capture_output=True,
                             text=True,
                             env=dict(env, **extra),
                             cwd=str(tmp_path),
                             timeout=120)
        out.seconds = time.time() - t0
        return out

    box.run = run

    def fake_nvcc(release):
        _write_exe(
            fakebin / 'nvcc', f"""#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release {release}, V{release}.131"
""")

    box.fake_nvcc = fake_nvcc

    def cached_wheel(flavor_suffix):
        d = (
            cache / 'wheels' / f'mmcv-{MMCV_VER}-torch{TORCH_VER}-{PY_TAG}-'
            f'{flavor_suffix}')
        d.mkdir(parents=True)
        (d / f'mmcv-{MMCV_VER}-{PY_TAG}-{PY_TAG}-linux_x86_64.whl'
         ).write_bytes(b'')
        return d

    box.cached_wheel = cached_wheel
    return box


def one_setup_line(out, *words):
    """Exit 2 and exactly one `[aa_det setup]` line, naming ``words``; nothing
    installed."""
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith(
        '[aa_det setup] '), out.stderr
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def other_cuda_major():
    if TORCH_CUDA is None:
        pytest.skip('this torch is a CPU-only build')
    major = int(TORCH_CUDA.split('.')[0])
    return f'{major - 1}.4'


@pytest.mark.parametrize('arch_list', ['9.0', None])
def test_nvcc_of_another_cuda_major_stops_before_any_download(
        sandbox, arch_list):
    """nvcc 12.4 against torch built for CUDA 13.0: exit 2 naming both, before
    pip or a build."""
    release = other_cuda_major()
    sandbox.fake_nvcc(release)
    extra = dict(AA_DET_FLAVOR='cuda')
    if arch_list:
        extra['TORCH_CUDA_ARCH_LIST'] = arch_list
    out = sandbox.run(**extra)
    line = one_setup_line(out, f'nvcc {release}', f'CUDA {TORCH_CUDA}',
                          TORCH_VER, 'AA_DET_TORCH_INDEX_URL',
                          'AA_DET_FLAVOR=cpu')
    assert str(sandbox.bin / 'nvcc') in line
    assert not any(sandbox.cache.iterdir()) and not (sandbox.venv /
                                                     '.aa_det_env').exists()


def test_forced_cuda_without_nvcc_or_gpu_says_what_is_missing(sandbox):
    """AA_DET_FLAVOR=cuda needs nvcc; without a visible GPU it needs
    TORCH_CUDA_ARCH_LIST."""
    if TORCH_CUDA is None:
        pytest.skip('this torch is a CPU-only build')
    one_setup_line(
        sandbox.run(
            AA_DET_FLAVOR='cuda', CUDA_HOME=str(sandbox.tmp / 'no-cuda')),
        'nvcc', 'AA_DET_FLAVOR=cpu')
    sandbox.fake_nvcc(TORCH_CUDA)
    out = sandbox.run(AA_DET_FLAVOR='cuda', CUDA_VISIBLE_DEVICES='')
    one_setup_line(out, 'TORCH_CUDA_ARCH_LIST')


@pytest.mark.parametrize('compiler', ['missing', 'too old'])
def test_missing_cxx_compiler_is_one_line_before_any_download(
        sandbox, compiler):
    """No compiler, or one without torch's C++ standard (C++20 for torch 2.14,
    C++17 for 2.1)."""
    if compiler == 'missing':
        cxx = str(sandbox.tmp / 'nowhere' / 'g++')
    else:
        cxx = str(
            _write_exe(
                sandbox.bin / 'old-g++', f"""#!/bin/sh
case "$*" in *{CXX_STD}*) echo "error: unrecognized command-line option '-std={CXX_STD}'" >&2; exit 1;; esac
exit 0
"""))  # noqa: E501
    out = sandbox.run(AA_DET_FLAVOR='cpu', CXX=cxx)
    one_setup_line(out, cxx, f'-std={CXX_STD}', TORCH_VER,
                   'apt-get install g++')
    assert not any(sandbox.cache.iterdir())


def test_missing_python_headers_is_one_line(sandbox):
    out = sandbox.run(
        AA_DET_FLAVOR='cpu', FAKE_PY_INCLUDE=str(sandbox.tmp / 'no-include'))
    one_setup_line(out, 'Python.h', 'python%d.%d-dev' % sys.version_info[:2])


def test_missing_venv_module_is_one_line_before_the_venv(sandbox):
    """A Python without ensurepip (Debian without python3.X-venv): named, and
    no venv is created."""
    fake = _write_exe(
        sandbox.bin / 'python-noenv', f"""#!/bin/sh
case "$*" in *ensurepip*) echo "No module named 'ensurepip'" >&2; exit 1;; esac
exec "{sys.executable}" "$@"
""")
    new_venv = sandbox.tmp / 'new-venv'
    out = sandbox.run(AA_DET_VENV=str(new_venv), AA_DET_PYTHON=str(fake))
    one_setup_line(out, 'ensurepip',
                   'apt-get install python%d.%d-venv' % sys.version_info[:2])
    assert not new_venv.exists()


def test_build_tools_are_checked_only_when_mmcv_must_be_built(sandbox):
    """A cached cpu wheel (the cache dir name of earlier versions): no compiler
    needed, on to pip."""
    sandbox.cached_wheel('cpu')
    out = sandbox.run(
        AA_DET_FLAVOR='cpu', CXX=str(sandbox.tmp / 'nowhere' / 'g++'))
    assert out.returncode == PIP_REFUSED, out.stderr
    assert 'checking torch' in out.stderr and CXX_STD not in out.stderr


def test_too_little_disk_for_torch_is_one_line_before_any_download(sandbox):
    """Pins of another torch (a download of several GB) and 3 GiB free: exit 2
    naming the venv and both sizes."""
    other = sandbox.tmp / 'constraints-other.txt'
    other.write_text(f'torch==0.0.1\nmmcv=={MMCV_VER}\n')
    _write_exe(
        sandbox.bin / 'df', """#!/bin/sh
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "/dev/fake 100000000 96854528 3145728 97% /"
""")
    out = sandbox.run(AA_DET_FLAVOR='cpu', AA_DET_CONSTRAINTS=str(other))
    one_setup_line(out, 'disk space', '8 GiB', '3 GiB free', str(sandbox.venv),
                   'AA_DET_VENV')


def test_pins_of_another_torch_than_the_venv_was_set_up_with_stop_before_pip(
        sandbox):
    """A venv set up with this stack's pins, run with another stack's
    (AA_DET_VENV without its AA_DET_CONSTRAINTS): exit 2 naming the venv, its
    torch and both files; pip never runs, so its torch stays."""
    other = sandbox.tmp / 'constraints-other.txt'
    other.write_text(f'torch==0.0.1\nmmcv=={MMCV_VER}\n')
    (sandbox.venv / '.aa_det_env'
     ).write_text(f'{_key()} cpu -\nwheel=x\nconstraints={CONSTRAINTS}\n')
    out = sandbox.run(AA_DET_FLAVOR='cpu', AA_DET_CONSTRAINTS=str(other))
    one_setup_line(out, str(sandbox.venv), 'AA_DET_VENV',
                   f'torch {TORCH_VER}', f'AA_DET_CONSTRAINTS={CONSTRAINTS}',
                   str(other), 'torch 0.0.1')
    # its own pins: ready at once
    out = sandbox.run(AA_DET_FLAVOR='cpu', AA_DET_CONSTRAINTS=CONSTRAINTS)
    assert out.returncode == 0 and out.stderr == '', out.stderr


def test_cache_dir_and_stamp_carry_flavour_and_arch(sandbox):
    """The cuda wheel cache is per GPU architecture; the venv stamp is per
    flavour and architecture."""
    release = other_cuda_major()
    # a mismatched nvcc: only a build would need it
    sandbox.fake_nvcc(release)
    sandbox.cached_wheel('cuda-arch9.0')
    cuda90 = dict(AA_DET_FLAVOR='cuda', TORCH_CUDA_ARCH_LIST='9.0')
    # the 9.0 wheel is cached: no build, so no nvcc check
    out = sandbox.run(**cuda90)
    assert (out.returncode == PIP_REFUSED
            and 'checking torch' in out.stderr), out.stderr
    one_setup_line(
        sandbox.run(AA_DET_FLAVOR='cuda', TORCH_CUDA_ARCH_LIST='8.0'),
        f'nvcc {release}')

    stamp = sandbox.venv / '.aa_det_env'
    stamp.write_text(f'{_key()} cuda 9.0\nwheel=x\n')
    out = sandbox.run(**cuda90)
    assert (out.returncode == 0 and out.stderr == ''
            and out.seconds < 10), out.stderr
    for other in (dict(AA_DET_FLAVOR='cpu'),
                  dict(AA_DET_FLAVOR='cuda', TORCH_CUDA_ARCH_LIST='8.0;9.0')):
        # not the fast path: a re-install is due
        assert sandbox.run(**other).returncode != 0

    stamp.write_text(f'{_key()} cpu -\nwheel=x\n')
    out = sandbox.run(AA_DET_FLAVOR='cpu')
    assert (out.returncode == 0 and out.stderr == ''
            and out.seconds < 10), out.stderr
    out = sandbox.run(
        AA_DET_FLAVOR='cpu',
        AA_DET_TORCH_INDEX_URL='https://download.pytorch.org/whl/cpu')
    assert out.returncode == PIP_REFUSED  # another torch index is another key


FAKE_PIP = r"""
import json, os, sys, tarfile, io
args = sys.argv[1:]
cmd = next(a for a in args if not a.startswith('-'))
entry = dict(cmd=cmd, args=args)
def opt(name):
    return args[args.index(name) + 1]
if cmd == 'download':   # an sdist whose setup.py asks for c++14, as mmcv's does
    ver = args[-1].split('==')[1]
    with tarfile.open(os.path.join(opt('-d'), f'mmcv-{ver}.tar.gz'), 'w:gz') as tar:
        data = b"extra_compile_args = ['-std=c++14']\n"
        info = tarfile.TarInfo(f'mmcv-{ver}/setup.py')
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
elif cmd == 'wheel':
    entry['env'] = {k: os.environ.get(k) for k in
                    ('MMCV_WITH_OPS', 'FORCE_CUDA', 'CUDA_VISIBLE_DEVICES', 'TORCH_CUDA_ARCH_LIST')}
    entry['setup.py'] = open('setup.py').read()
    open(os.path.join(opt('-w'), 'mmcv-2.1.0-cp311-cp311-linux_x86_64.whl'), 'wb').close()
with open(os.environ['FAKE_PIP_LOG'], 'a') as f:
    f.write(json.dumps(entry) + '\n')
"""  # noqa: E501


@pytest.mark.parametrize(
    'flavor', ['cpu', pytest.param('cuda', marks=pytest.mark.slow)])
def test_whole_setup_with_a_fake_pip(sandbox, flavor):
    """The slow path end to end, pip faked: build environment per flavour,
    cache dir, stamp."""
    import json
    fake_pip = sandbox.tmp / 'fake_pip.py'
    fake_pip.write_text(FAKE_PIP)
    log = sandbox.tmp / 'pip.log'
    extra = dict(
        FAKE_PIP=str(fake_pip), FAKE_PIP_LOG=str(log), AA_DET_FLAVOR=flavor)
    if flavor == 'cuda':
        if TORCH_CUDA is None:
            pytest.skip('this torch is a CPU-only build')
        sandbox.fake_nvcc(TORCH_CUDA)
        extra['TORCH_CUDA_ARCH_LIST'] = '9.0 8.0'
        suffix, arch = 'cuda-arch8.0_9.0', '8.0_9.0'
    else:
        suffix, arch = 'cpu', '-'
    out = sandbox.run(**extra)
    assert (out.returncode == 0
            and 'environment ready' in out.stderr), out.stderr
    wheels = (
        sandbox.cache / 'wheels' / f'mmcv-{MMCV_VER}-torch{TORCH_VER}-'
        f'{PY_TAG}-{suffix}')
    assert [p.name for p in wheels.iterdir()
            ] == ['mmcv-2.1.0-cp311-cp311-linux_x86_64.whl']
    assert (sandbox.venv / '.aa_det_env').read_text() == (
        f'{_key()} {flavor} {arch}\nwheel={wheels}\n'
        f'constraints={CONSTRAINTS}\n')
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c['cmd'] for c in calls
            ] == ['install', 'download', 'wheel', 'install', 'install']
    assert '-q' in calls[0]['args']  # torch already there: a quiet check
    build = calls[2]
    assert f'-std={CXX_STD}' in build['setup.py'] and 'c++14' not in build[
        'setup.py']
    if flavor == 'cuda':
        assert build['env'] == dict(
            MMCV_WITH_OPS='1',
            FORCE_CUDA='1',
            CUDA_VISIBLE_DEVICES=None,
            TORCH_CUDA_ARCH_LIST='8.0;9.0')
    # the GPU hidden: mmcv's setup.py would add CUDA ops whenever torch sees
    # one
    else:
        assert build['env'] == dict(
            MMCV_WITH_OPS='1',
            FORCE_CUDA='0',
            CUDA_VISIBLE_DEVICES='',
            TORCH_CUDA_ARCH_LIST=None)
    assert '--force-reinstall' in calls[3]['args'] and str(wheels) in ' '.join(
        calls[3]['args'])
    again = sandbox.run(**extra)
    assert again.returncode == 0 and again.stderr == '' and len(
        log.read_text().splitlines()) == 5


def test_bad_flavor_is_one_line(sandbox):
    one_setup_line(
        sandbox.run(AA_DET_FLAVOR='gpu'), 'AA_DET_FLAVOR', 'auto, cpu or cuda')


# ---- tools/env/env_check.py: mmcv ops without CUDA on a CUDA
# machine ---------------------------------


@pytest.fixture
def env_check(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(osp.join(ROOT, 'tools', 'env'))
    import env_check
    import mmcv.ops
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    # where the venv stamp is read
    monkeypatch.setattr(sys, 'prefix', str(tmp_path))
    return env_check, mmcv.ops, tmp_path


@pytest.mark.parametrize(
    'wheel_dir',
    [None, '/c/wheels/mmcv-2.1.0-torch2.14.1+cu130-cp311-cuda-arch9.0'])
def test_env_check_fails_when_ops_lack_cuda_on_a_gpu_machine(
        env_check, monkeypatch, capsys, wheel_dir):
    check, ops, prefix = env_check
    if wheel_dir:
        (prefix /
         '.aa_det_env').write_text(f'key cuda 9.0\nwheel={wheel_dir}\n')
    monkeypatch.setattr(ops, 'get_compiling_cuda_version',
                        lambda: 'not available')
    with pytest.raises(SystemExit) as e:
        check.require_env()
    err = capsys.readouterr().err
    assert (e.value.code == 2 and 'built without CUDA' in err
            and 'AA_DET_FLAVOR=cuda' in err), err
    assert ('delete ' +
            wheel_dir in err) if wheel_dir else ('delete' not in err)


def test_env_check_fails_when_cuda_kernels_do_not_run(env_check, monkeypatch,
                                                      capsys):
    check, ops, prefix = env_check
    wheel_dir = '/c/wheels/mmcv-2.1.0-torch2.14.1+cu130-cp311-cuda-arch8.0'
    (prefix / '.aa_det_env').write_text(f'key cuda 8.0\nwheel={wheel_dir}\n')
    monkeypatch.setattr(ops, 'get_compiling_cuda_version', lambda: '13.0')

    def no_kernel():
        raise RuntimeError(
            'CUDA error: no kernel image is available for execution on the '
            'device\nmore')

    monkeypatch.setattr(check, '_nms_on_cuda', no_kernel)
    with pytest.raises(SystemExit) as e:
        check.require_env()
    err = capsys.readouterr().err
    assert (e.value.code == 2 and 'no kernel image' in err and f'delete '
            f'{wheel_dir}' in err), err
    assert 'more' not in err and 'Traceback' not in err


def test_env_check_passes_with_cuda_ops_or_without_gpu(env_check, monkeypatch):
    check, ops, _ = env_check
    monkeypatch.setattr(ops, 'get_compiling_cuda_version', lambda: '13.0')
    monkeypatch.setattr(check, '_nms_on_cuda', lambda: None)
    check.require_env()
    import torch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(ops, 'get_compiling_cuda_version',
                        lambda: 'not available')
    check.require_env()


def _requirement_lines(path):
    with open(path) as f:
        return [
            line.split('#')[0].strip() for line in f
            if line.split('#')[0].strip()
        ]


def test_every_tested_stack_pins_mmpretrain_with_the_module_it_imports():
    """The classification configs are mmpretrain configs: mmpretrain is the
    ``cls`` extra's requirement (which the ``tests`` extra the script installs
    includes), pinned in each tested stack and in this venv; so is
    ``model-index``, which provides the ``modelindex`` module mmpretrain
    imports (the ``modelindex`` 0.0.2 it declares is an empty wheel)."""
    from importlib.metadata import version

    from packaging.requirements import Requirement
    cls = {
        Requirement(line).name: Requirement(line)
        for line in _requirement_lines(
            osp.join(ROOT, 'requirements', 'cls.txt'))
    }
    assert cls['mmpretrain'].specifier.contains(
        '1.2.0') and 'model-index' in cls
    for path in glob.glob(osp.join(ROOT, 'requirements', 'constraints*.txt')):
        pins = dict(
            line.split('==') for line in _requirement_lines(path)
            if '==' in line)
        assert (pins.get('mmpretrain'),
                pins.get('model-index')) == ('1.2.0', '0.1.11'), path
    pins = dict(
        line.split('==') for line in _requirement_lines(CONSTRAINTS)
        if '==' in line)
    assert (version('mmpretrain'),
            version('model-index')) == (pins['mmpretrain'],
                                        pins['model-index'])
    with open(SCRIPT) as f:
        # the script's last check
        assert "-c 'import mmcv.ops, mmdet, mmpretrain, aa_det'" in f.read()
    import modelindex  # noqa: F401  (what `import mmpretrain` needs)
