"""Plot the training curves of an mmengine run: losses and lr per iteration,
validation metrics (coco/bbox_mAP*, accuracy/top1, ...) per epoch.

    .venv/bin/python tools/analysis_tools/plot_curves.py WORK_DIR_OR_JSON
        [--out curves.png]
        [--keys loss loss_cls loss_bbox lr coco/bbox_mAP ...]

WORK_DIR_OR_JSON: a work dir (its newest run,
WORK_DIR/<timestamp>/vis_data/scalars.json, is read), one run's <timestamp>
folder, or a scalars.json file. A resumed run logs into a new <timestamp>
folder, so the newest one starts where the resume did. Default keys: every
logged key starting with 'loss', 'lr', and every validation metric. Keys may be
glob patterns ('coco/*'). COCO's -1 (no objects of that size) is not drawn.

mmdet's tools/analysis_tools/analyze_logs.py plots listed JSON files by
exact keys and needs seaborn; this one adds what its tests check: a work
dir read at its newest run, glob keys, COCO's -1 left out, and matplotlib
alone (the vis extra).
"""
import argparse
import fnmatch
import glob
import json
import math
import os
import os.path as osp
import sys

# the logs are JSON: nothing of torch or mmdet is imported, so it starts in a
# second
try:
    import matplotlib
except ImportError as e:
    raise SystemExit(
        f'aa_det: plot_curves.py needs matplotlib, not installed in '
        f'{sys.executable} ({e})') from None

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

# Bookkeeping that mmengine writes next to the scalars; never plotted as a
# validation metric.
NOT_METRICS = {'step', 'epoch', 'iter', 'time', 'data_time', 'memory'}


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'path',
        metavar='WORK_DIR_OR_JSON',
        help='work dir, run folder or scalars.json')
    parser.add_argument('--out', default='curves.png', help='the PNG to write')
    parser.add_argument(
        '--keys',
        nargs='+',
        help="keys or glob patterns to plot (default: loss*, lr, "
        "the validation metrics)")
    return parser.parse_args()


def find_scalars(path):
    """The scalars.json to read: the file itself, a run's, or the newest run's
    of a work dir."""
    if osp.isfile(path):
        return path
    if not osp.isdir(path):
        raise SystemExit(f'aa_det: work dir or scalars.json not found: {path}')
    for candidate in (osp.join(path, 'scalars.json'),
                      osp.join(path, 'vis_data', 'scalars.json')):
        if osp.isfile(candidate):
            return candidate
    runs = glob.glob(
        osp.join(glob.escape(path), '*', 'vis_data', 'scalars.json'))
    if not runs:
        raise SystemExit(
            f'aa_det: no training log (<timestamp>/vis_data/scalars.json) in '
            f'{path}')
    # <timestamp> folders (YYYYmmdd_HHMMSS) sort in time order; mtime breaks
    # other names' ties
    return max(
        runs,
        key=lambda p:
        (osp.basename(osp.dirname(osp.dirname(p))), osp.getmtime(p)))


def read_scalars(path):
    """The JSON lines of ``path``; a cut-off last line (a run killed mid-write)
    is skipped."""
    with open(path) as f:
        lines = [(n, line.strip()) for n, line in enumerate(f, 1)
                 if line.strip()]
    records = []
    for i, (n, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as e:
            if i == len(lines) - 1 and records:
                print(
                    f'aa_det: skipped the incomplete last line {n} of {path}',
                    file=sys.stderr)
                break
            raise SystemExit(
                f'aa_det: {path} line {n} is not JSON ({e})') from None
        if not isinstance(record, dict) or 'step' not in record:
            raise SystemExit(
                f'aa_det: {path} line {n} is not an mmengine scalars record '
                f'(no "step")')
        records.append(record)
    if not records:
        raise SystemExit(f'aa_det: {path} has no logged scalars')
    return records


def is_train(record):
    """Training lines carry the global ``iter`` (and lr, losses); validation
    lines do not."""
    return 'iter' in record or 'lr' in record or any(
        k.startswith('loss') for k in record)


def numeric_keys(records):
    keys = []
    for record in records:
        for key, value in record.items():
            if key not in keys and isinstance(
                    value, (int, float)) and not isinstance(value, bool):
                keys.append(key)
    return keys


def series(records, key, x_key):
    """(xs, ys) of ``key``, without non-numbers and COCO's -1 'not
    applicable'."""
    points = [(r.get(x_key, r['step']), r[key]) for r in records
              if isinstance(r.get(key), (
                  int, float)) and not isinstance(r.get(key), bool)
              and math.isfinite(r[key]) and not ('/' in key and r[key] == -1)]
    return [p[0] for p in points], [p[1] for p in points]


def select_keys(requested, train_keys, val_keys, path):
    """Expand ``requested`` (names or globs) to the logged keys, in the order
    asked."""
    available = train_keys + [k for k in val_keys if k not in train_keys]
    if requested is None:
        requested = ([k for k in train_keys if k.startswith('loss')] + ['lr'] *
                     ('lr' in train_keys) + [
                         k for k in val_keys
                         if k not in NOT_METRICS and k not in train_keys
                     ])
        if not requested:
            raise SystemExit(
                f'aa_det: {path} logs no loss, lr or validation metric '
                f'(keys: {", ".join(available)})')
    chosen = []
    for pattern in requested:
        matches = [k for k in available if fnmatch.fnmatchcase(k, pattern)]
        if not matches:
            raise SystemExit(
                f'aa_det: --keys {pattern} is not logged in {path} '
                f'(logged: {", ".join(available)})')
        chosen += [k for k in matches if k not in chosen]
    return chosen


def group_of(key, train_keys):
    """The subplot a key is drawn in: losses, learning rate, one per metric
    prefix, or its own."""
    if key in train_keys:
        if key.startswith('loss'):
            return 'losses'
        if key.endswith('lr'):
            return 'learning rate'
        return key
    return (f'validation: {key.split("/")[0]}'
            if '/' in key else f'validation: '
            f'{key}')


def main():
    args = parse_args()
    path = find_scalars(args.path)
    records = read_scalars(path)
    train = [r for r in records if is_train(r)]
    val = [r for r in records if not is_train(r)]
    train_keys, val_keys = numeric_keys(train), numeric_keys(val)
    keys = select_keys(args.keys, train_keys, val_keys, path)
    empty = [
        k for k in keys
        if not series(train if k in train_keys else val, k, 'step')[0]
    ]
    if empty:
        print(
            f'aa_det: not drawn, logged only as -1/NaN in {path}: '
            f'{", ".join(empty)}',
            file=sys.stderr)
        keys = [k for k in keys if k not in empty]
        if not keys:
            raise SystemExit(f'aa_det: nothing to draw from {path}')

    groups = {}
    for key in keys:
        groups.setdefault(group_of(key, train_keys), []).append(key)
    by_epoch = any('epoch' in r for r in train)
    ncols = 1 if len(groups) == 1 else 2
    nrows = math.ceil(len(groups) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(6.4 * ncols, 4 * nrows), squeeze=False, dpi=100)
    for ax in axes.flat[len(groups):]:
        ax.remove()
    for ax, (title, group_keys) in zip(axes.flat, groups.items()):
        validation = title.startswith('validation')
        for key in group_keys:
            xs, ys = series(val if validation else train, key,
                            'step' if validation else 'iter')
            ax.plot(
                xs,
                ys,
                label=key,
                marker='o' if validation or len(xs) < 30 else None,
                markersize=4,
                linewidth=1.2)
        xs = [x for line in ax.get_lines() for x in line.get_xdata()]
        # a single epoch / logged iteration: integer ticks around it
        if xs and min(xs) == max(xs):
            ax.set_xlim(min(xs) - 1, max(xs) + 1)
        ax.set_title(title)
        ax.set_xlabel(('epoch' if by_epoch else 'iteration'
                       ) if validation else 'iteration')
        # iterations and epochs are counts
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    run = (
        osp.dirname(osp.dirname(osp.abspath(path))) if osp.basename(
            osp.dirname(path)) == 'vis_data' else osp.abspath(path))
    fig.suptitle(run, fontsize=9)
    fig.tight_layout()
    if osp.dirname(args.out):
        os.makedirs(osp.dirname(args.out), exist_ok=True)
    fig.savefig(args.out)
    plt.close(fig)
    print(f'{args.out}: '
          f'{", ".join(f"{t} ({len(k)})" for t, k in groups.items())} from '
          f'{path}')


if __name__ == '__main__':
    main()
