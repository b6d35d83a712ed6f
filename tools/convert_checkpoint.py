"""Rewrite a trusted mmengine checkpoint that torch's safe loading refuses into
one it reads.

    .venv/bin/python tools/convert_checkpoint.py OLD.pth NEW.pth

mmengine 0.10.7's Runner writes its MessageHub as ``HistoryBuffer`` objects
holding numpy arrays, which ``torch.load(weights_only=True)`` (torch >= 2.6's
default) refuses: ``Unsupported global: ...HistoryBuffer``. Our configs write
checkpoints without them (``SafeCheckpointHook``); a checkpoint of another
config is converted here once: ``OLD`` is loaded with exactly the types
mmengine's Runner writes allowed (a file holding anything else is refused), and
saved with the same plain types the hook writes
(``aa_det.engine.checkpoints.to_safe_types``). The result loads in mmdet's
``init_detector`` / ``DetInferencer`` / ``tools/test.py``, ``load_from``,
mmpretrain's ``init_model``, and ``--resume`` (the MessageHub's histories read
back where the config has the hook).
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), 'env'))
from env_check import require_env, run_cli  # noqa: E402

require_env()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mmengine.logging import HistoryBuffer  # noqa: E402

from aa_det.engine.checkpoints import read_checkpoint  # noqa: E402
from aa_det.engine.checkpoints import to_safe_types  # noqa: E402
from aa_det.utils import ConfigError  # noqa: E402


def runner_globals() -> list:
    """What ``torch.serialization.get_unsafe_globals_in_checkpoint`` reports
    for the checkpoints mmengine 0.10.7's Runner writes: ``HistoryBuffer``,
    ``getattr`` (its statistics methods), numpy arrays, dtypes and scalars,
    numpy's functions under numpy 1's and 2's module names
    (``(function, name)`` pairs)."""
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    names = [(f, f'numpy.{core}.multiarray.{f.__name__}')
             for f in (_reconstruct, scalar) for core in ('core', '_core')]
    return [
        HistoryBuffer, getattr, np.ndarray, np.dtype,
        type(np.dtype(np.float64)),
        type(np.dtype(np.int64))
    ] + names


def main():
    parser = argparse.ArgumentParser(
        description='Rewrite a trusted mmengine checkpoint for torch\'s safe '
        'loading')
    parser.add_argument(
        'input',
        help='the checkpoint to convert (trusted: it is unpickled with '
        'mmengine\'s types)')
    parser.add_argument(
        'output', help='where the converted checkpoint is written')
    args = parser.parse_args()
    if not osp.isfile(args.input):
        raise ConfigError(f'checkpoint file not found: {args.input}')
    # torch >= 2.6: loads are safe by default
    if hasattr(torch.serialization, 'safe_globals'):
        with torch.serialization.safe_globals(runner_globals()):
            checkpoint = read_checkpoint(args.input)
    else:
        checkpoint = read_checkpoint(args.input)
    torch.save(
        {
            key: value if key == 'state_dict' else to_safe_types(value)
            for key, value in checkpoint.items()
        }, args.output)
    print(
        f'aa_det: wrote {args.output}: torch.load(weights_only=True) reads it')


if __name__ == '__main__':
    run_cli(main)
