"""Fail with one clear line, not a traceback, when a tool runs outside the environment.

Standard library only: it must work under any Python.
"""
import sys

FIX = ('Create or repair the environment with `bash tools/setup_env.sh` (README), then run tools '
       'with `.venv/bin/python tools/<tool>.py ...`.')


def _die(message):
    sys.stderr.write(f'aa_det: {message}\n{FIX}\n')
    raise SystemExit(2)


def require_env():
    """Import the stack and aa_det, or exit 2 saying what is wrong and how to fix it."""
    try:
        import torch  # noqa: F401
        import mmengine  # noqa: F401
        import mmcv  # noqa: F401
        import mmdet  # noqa: F401
    except ImportError as e:
        _die(f'required package {e.name!r} is not installed in {sys.executable} ({e}).')
    try:
        from mmcv.ops import nms  # noqa: F401  (loads mmcv._ext)
    except Exception as e:  # noqa: BLE001  any failure here means a broken build
        _die(f'mmcv is installed without working compiled ops ({type(e).__name__}: {e}). '
             'Delete the cached wheel (~/.cache/aa_det/wheels/mmcv-*) and .venv to rebuild it.')
    try:
        import aa_det  # noqa: F401
    except ImportError as e:
        _die(f'the aa_det package cannot be imported ({e}).')


def run_cli(main):
    """Run a tool's ``main``; a ``ConfigError`` (bad config, missing file) exits 2 with one line."""
    from aa_det.apis import ConfigError
    try:
        main()
    except ConfigError as e:
        sys.stderr.write(f'aa_det: {e}\n')
        raise SystemExit(2) from None
