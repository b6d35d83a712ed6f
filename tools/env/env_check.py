"""Fail with one clear line, not a traceback, when a tool runs outside the
environment.

Standard library only at module level: it must work under any Python.
"""
import os
import sys

FIX = (('Create or repair the environment with `bash tools/env/setup_env.sh` '
        '(README), then run the tools with `.venv/bin/python <tool>.py ...`.'))


def _die(message, fix=FIX):
    sys.stderr.write(f'aa_det: {message}\n{fix}\n')
    raise SystemExit(2)


def _cached_wheel_dir():
    """The cached mmcv wheel dir this venv was installed from, as
    tools/env/setup_env.sh recorded it."""
    try:
        with open(os.path.join(sys.prefix, '.aa_det_env')) as f:
            for line in f:
                if line.startswith('wheel='):
                    return line[len('wheel='):].strip()
    except OSError:
        pass
    return None


def _nms_on_cuda():
    """Run mmcv's NMS kernel once on the GPU this process would use (LOCAL_RANK
    under torchrun)."""
    import torch
    from mmcv.ops import nms
    device = torch.device(
        'cuda',
        int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count())
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]],
                         device=device)
    nms(boxes, torch.tensor([0.9, 0.8], device=device), 0.5)
    torch.cuda.synchronize(device)


def _check_cuda_ops():
    """Where torch sees a GPU, mmcv's ops must have CUDA kernels that run on
    it."""
    import torch
    if not torch.cuda.is_available():
        return
    from mmcv.ops import get_compiling_cuda_version
    wheel = _cached_wheel_dir()
    if get_compiling_cuda_version() == 'not available':
        where = f' (installed from {wheel})' if wheel else ''
        stale = (f'delete {wheel} (a cached wheel without CUDA ops), then '
                 if wheel and '-cuda' in os.path.basename(wheel) else '')
        _die(
            f'torch sees a GPU but mmcv\'s compiled ops were built without '
            f'CUDA{where}: the first NMS on the GPU would fail.',
            f'Fix: {stale}with nvcc on PATH run `AA_DET_FLAVOR=cuda bash '
            f'tools/env/setup_env.sh` (README); or run on the CPU, with the '
            f'GPU hidden by CUDA_VISIBLE_DEVICES="".')
    try:
        _nms_on_cuda()
    # e.g. "no kernel image is available": built for another GPU
    except Exception as e:  # noqa: BLE001
        first = (str(e).strip().splitlines() or [''])[0]
        _die(
            f'mmcv\'s CUDA ops fail on this GPU ({type(e).__name__}: '
            f'{first}); a wheel built for other GPU architectures gives "no '
            f'kernel image is available".', 'Fix: delete ' +
            (wheel or 'the cached wheel ~/.cache/aa_det/wheels/mmcv-*-cuda-*')
            + ' and run `bash tools/env/setup_env.sh` again with nvcc on PATH '
            '(it builds for the GPUs torch sees, or for '
            'TORCH_CUDA_ARCH_LIST).')


def supported_versions():
    """``SUPPORTED_VERSIONS`` of the installed aa_det (aa_det/version.py), read
    without importing aa_det, which imports the stack this checks; None where
    aa_det is not installed (``require_env`` then reports its import)."""
    import importlib.util
    spec = importlib.util.find_spec('aa_det')
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], 'version.py')
    namespace = {}
    with open(path) as f:
        exec(compile(f.read(), path, 'exec'), namespace)
    return namespace['SUPPORTED_VERSIONS']


def check_versions(supported=None):
    """The installed packages lie in the ranges of ``supported``
    (requirement strings; default: the installed aa_det's
    ``SUPPORTED_VERSIONS``: torch, torchvision, mmcv, mmengine, mmdet), and
    numpy is 1.x under a torch built before NumPy 2 (torch < 2.4); otherwise
    exit 2 with one line naming the package, the version found and the
    range. ``AA_DET_ALLOW_UNSUPPORTED=1`` turns that line into a warning and
    goes on."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement
    from packaging.version import Version
    if supported is None:
        supported = supported_versions() or ()
    problems = []
    for line in supported:
        req = Requirement(line)
        try:
            found = version(req.name)
        except PackageNotFoundError:
            continue  # an import failure, reported by require_env
        if not req.specifier.contains(found, prereleases=True):
            problems.append(f'{req.name} {found} is outside the supported '
                            f'range {req.specifier}')
    torch_ver, numpy_ver = Version(version('torch')), Version(version('numpy'))
    if torch_ver.release[:2] < (2, 4) and numpy_ver.major >= 2:
        problems.append(
            f'numpy {numpy_ver} with torch {torch_ver}: torch < 2.4 was built '
            f'against NumPy 1.x, install numpy<2')
    if not problems:
        return
    message = '; '.join(problems) + (
        ' (aa_det/version.py SUPPORTED_VERSIONS; tested stacks: '
        'requirements/constraints*.txt)')
    if os.environ.get('AA_DET_ALLOW_UNSUPPORTED') == '1':
        sys.stderr.write(f'aa_det: warning: {message}\n')
        return
    _die(
        message, 'Fix: install a supported version (docs/setup.md), or set '
        'AA_DET_ALLOW_UNSUPPORTED=1 to run anyway.')


def require_env():
    """Import the stack and aa_det, check their versions, or exit 2 saying what
    is wrong and how to fix it."""
    import warnings

    # mmengine imports pkg_resources (deprecated by setuptools) when a config
    # names an ``mmdet::`` base; the warning says nothing to the user and would
    # precede our one line.
    warnings.filterwarnings(
        'ignore', message='pkg_resources is deprecated', category=UserWarning)
    try:
        # isort: off
        import torch  # noqa: F401
        import mmengine  # noqa: F401
        import mmcv  # noqa: F401
        import mmdet  # noqa: F401
        # isort: on
    except ImportError as e:
        _die(f'required package {e.name!r} is not installed in '
             f'{sys.executable} ({e}).')
    check_versions()
    try:
        from mmcv.ops import nms  # noqa: F401  (loads mmcv._ext)
    # any failure here means a broken build
    except Exception as e:  # noqa: BLE001
        _die(f'mmcv is installed without working compiled ops '
             f'({type(e).__name__}: {e}). Delete the cached wheel '
             f'(~/.cache/aa_det/wheels/mmcv-*) and .venv to rebuild it.')
    _check_cuda_ops()
    try:
        import aa_det  # noqa: F401
    except ImportError as e:
        _die(f'the aa_det package cannot be imported ({e}).')


def run_cli(main):
    """Run a tool's ``main``; a ``ConfigError`` (bad config, missing file), a
    ``RunError`` (a run stopped on a non-finite loss or output) or a file that
    mmengine does not find (``FileNotFoundError``: a ``Pretrained`` checkpoint,
    ...) exits 2 with one line."""
    from aa_det.utils import ConfigError, RunError
    try:
        main()
    except (ConfigError, RunError, FileNotFoundError) as e:
        sys.stderr.write(f'aa_det: {e}\n')
        raise SystemExit(2) from None
