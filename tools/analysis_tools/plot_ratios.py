"""Draw the README's chart of AA-ResNet-50's and GSA-ResNet-50's costs as
ratios to ResNet-50, from the benchmarks' own output files (never from typed
numbers).

    .venv/bin/python tools/analysis_tools/plot_ratios.py
        [--out docs/img/benchmark_ratios.png]
        [--speed docs/data/detection_speed_cpu.json]
        [--counts docs/data/op_counts.json]

``--speed``: written by ``benchmarks/detection_speed.py --json`` (train step,
backbone forward + backward, inference); ``--counts``: by
``benchmarks/op_counts.py --json`` (kernel launches of the CUDA path, non-GEMM
bytes, peak memory). :func:`chart_rows` is what the README's figures are
checked against (``tests/test_docs.py``).
"""
import argparse
import json
import os.path as osp
import sys

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SPEED = osp.join(ROOT, 'docs/data/detection_speed_cpu.json')
COUNTS = osp.join(ROOT, 'docs/data/op_counts.json')
MODELS = ('AA-ResNet-50', 'GSA-ResNet-50')


def chart_rows(speed_path: str = SPEED, counts_path: str = COUNTS) -> list:
    """``(label, AA ratio, GSA ratio)`` per bar pair, each ratio to ResNet-50
    from the two files."""
    with open(speed_path) as f:
        speed = json.load(f)
    with open(counts_path) as f:
        counts = json.load(f)
    timed = speed['results']
    # the first batch measured
    counted = next(iter(counts['results_by_batch'].values()))
    amp = counts['settings']['amp']
    size = counts['settings']['size']
    rows = [(f'RetinaNet train step\nCPU time, {speed["settings"]["size"]}px',
             timed, 'train_s'),
            ('backbone fwd + bwd\nCPU time', timed, 'backbone_s'),
            ('inference 1333x800\nCPU time', timed, 'infer_s'),
            (f'kernel launches\nof the CUDA path, {amp}', counted, 'ops'),
            (f'non-GEMM bytes\n{amp}, {size}px', counted, 'bytes'),
            (f'peak memory\n{amp}, {size}px', counted, 'peak')]
    return [(label, *(table[m][key] / table['ResNet-50'][key] for m in MODELS))
            for label, table, key in rows]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--out', default=osp.join(ROOT, 'docs/img/benchmark_ratios.png'))
    parser.add_argument('--speed', default=SPEED)
    parser.add_argument('--counts', default=COUNTS)
    args = parser.parse_args()
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows = chart_rows(args.speed, args.counts)
    with open(args.speed) as f:
        speed = json.load(f)
    with open(args.counts) as f:
        counts = json.load(f)
    fig, ax = plt.subplots(figsize=(9, 4))
    x = range(len(rows))
    for offset, column, name in ((-0.2, 1, MODELS[0]), (0.2, 2, MODELS[1])):
        bars = ax.bar([i + offset for i in x], [row[column] for row in rows],
                      width=0.38,
                      label=name)
        ax.bar_label(bars, fmt='%.2fx', fontsize=7)
    ax.axhline(1.0, color='k', linewidth=0.8, label='ResNet-50 (1.0)')
    ax.set_xticks(list(x), [row[0] for row in rows], fontsize=7)
    ax.set_ylabel('ratio to ResNet-50')
    ax.set_ylim(0, max(max(r[1:]) for r in rows) * 1.2)
    ax.set_title(
        f'Cost vs ResNet-50 on the CPU: detection_speed.py at '
        f'{speed["commit"]}, op_counts.py at {counts["commit"]} (torch '
        f'{counts["torch"]})',
        fontsize=8)
    ax.legend(fontsize=8, loc='upper left')
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(args.out)


if __name__ == '__main__':
    sys.exit(main())
