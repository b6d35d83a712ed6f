"""Run a tool (a Python script) in a process of its own, forked from one that
imported the stack once.

A tool's interpreter spends about 6 s importing torch, mmcv, mmdet, mmpretrain
and aa_det before it reads its arguments, and the tests run some sixty tools.
:func:`run_python` runs each in a child forked from a server process that
imported them once (started at the first call of a pytest session): the script
runs as ``__main__`` with its own ``argv``, ``sys.path[0]``, environment,
working directory, stdout and stderr, and exits with the status Python would
give it (``SystemExit``'s code; an uncaught exception's traceback on stderr and
status 1). The server runs no torch op before it forks, so no thread pool is
copied. What such a child cannot show, a plain ``subprocess`` tests: the
imports themselves (``test_foundation``), another interpreter or venv
(``test_stacks``), a config's ``custom_imports``.
"""
import atexit
import functools
import json
import os
import os.path as osp
import runpy
import subprocess
import sys
import tempfile
import traceback

#: what every tool imports (directly or through aa_det), imported once by the
#: server
PRELOAD = ('torch', 'torchvision', 'mmcv.ops', 'mmengine.runner',
           'mmdet.models', 'mmdet.apis', 'mmpretrain', 'pycocotools.coco',
           'aa_det')

#: the environment the server starts in: this process's when the tests were
#: collected, before any test changed it (a child's own environment is the one
#: :func:`run_python` is given)
_SERVER_ENV = dict(os.environ)
_server = _server_log = None


def run_python(argv, env=None, cwd=None) -> subprocess.CompletedProcess:
    """``python *argv`` (``argv[0]`` a script) as :func:`subprocess.run` with
    ``capture_output=True, text=True`` runs it, in a child of the preloaded
    server.

    Args:
        argv (Sequence): the script and its arguments (converted with ``str``).
        env (dict, optional): the child's environment; defaults to this
            process's. ``OMP_NUM_THREADS`` in it sets torch's threads, as it
            does at a fresh interpreter's start.
        cwd (str, optional): the child's working directory; defaults to this
            process's.

    Returns:
        subprocess.CompletedProcess: ``args`` (``[sys.executable, *argv]``),
        ``returncode``, ``stdout`` and ``stderr``.
    """
    global _server, _server_log
    argv = [str(a) for a in argv]
    if _server is None or _server.poll() is not None:
        # what the server itself prints: its imports' warnings
        _server_log = tempfile.TemporaryFile()
        _server = subprocess.Popen(
            [sys.executable, osp.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=_server_log,
            text=True,
            env=_SERVER_ENV)
        atexit.register(_server.kill)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = osp.join(tmp, 'stdout'), osp.join(tmp, 'stderr')
        request = dict(
            argv=argv,
            env=dict(os.environ if env is None else env),
            cwd=str(cwd or os.getcwd()),
            out=out,
            err=err)
        _server.stdin.write(json.dumps(request) + '\n')
        _server.stdin.flush()
        reply = _server.stdout.readline()
        if not reply:
            _server_log.seek(0)
            raise RuntimeError(
                f'tool_process: the server stopped (exit status '
                f'{_server.wait()}):\n' +
                _server_log.read().decode(errors='replace')[-3000:])
        with open(out) as f_out, open(err) as f_err:
            return subprocess.CompletedProcess([sys.executable, *argv],
                                               int(reply), f_out.read(),
                                               f_err.read())


def _child(request):
    """In the forked child: run the script as ``python argv...`` would, then
    exit."""
    for fd, path in ((1, request['out']), (2, request['err'])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    if 'OMP_NUM_THREADS' in os.environ:
        import torch
        torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
    sys.argv = request['argv']
    sys.path[0] = osp.dirname(osp.abspath(sys.argv[0]))
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name='__main__')
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _parse_model_indexes_once():
    """mmengine parses every metafile of a package's model index (hundreds of
    YAML files, about 0.5 s) whenever a config names one of its bases by
    package scope (``mmdet::``): the files, which are the installed packages',
    are parsed once here, and every child starts with them parsed."""
    import mmengine.config.utils as config_utils
    from mmengine.utils import get_installed_path
    config_utils.load = functools.lru_cache(maxsize=None)(config_utils.load)
    for package in ('mmdet', 'mmpretrain'):
        try:
            config_utils._get_cfg_metainfo(get_installed_path(package), '')
        # '' names no config, after every metafile was read
        except (ValueError, ImportError, OSError):
            pass


def _serve():
    """Import :data:`PRELOAD`, then fork one child per request line and answer
    its exit status."""
    for name in PRELOAD:
        try:
            __import__(name)
        # a stack without it: the tool that needs it fails in its child, as it
        # would alone
        except ImportError:
            pass
    _parse_model_indexes_once()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        status = os.waitpid(pid, 0)[1]
        code = os.waitstatus_to_exitcode(status)
        sys.stdout.write(f'{code}\n')
        sys.stdout.flush()


if __name__ == '__main__':
    _serve()
