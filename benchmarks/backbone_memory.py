"""CPU peak memory of one backbone forward + backward, with ``with_cp`` off and
on, as a ratio to ResNet-50's.

Each backbone (the class defaults: AA-ResNet-50, GSA-ResNet-50 with attention
in every stage) runs in its own process, once with ``with_cp=False`` (the
default) and once with ``with_cp=True`` (every residual block recomputed in the
backward): one fp32 forward + backward (``sum of the outputs' means``) of a
1x3x1024x1024 image (``--size``), training mode. Ratios are to ResNet-50 with
the same ``with_cp``. Two figures per case, each over the step, after the model
and input exist:

* ``live``: the peak sum of the bytes of the tensors alive (``OpCounter`` of
  ``op_counts.py``: every storage an op returns, from its creation until it is
  freed), what a GPU's ``max_memory_allocated`` counts. Exact and the same in
  every run: one process per case.
* ``RSS``: the growth of the peak resident memory (``ru_maxrss``), what the
  machine gives the process: the live peak plus what glibc's heap holds between
  freed blocks, which depends on the order and sizes of allocations and varies
  from run to run (by up to 0.6 GiB for one backbone): the median of
  ``--repeats`` processes.
``--root`` imports ``aa_det`` from another checkout (e.g. a ``git worktree`` of
an older commit), so two versions can be measured side by side.

    .venv/bin/python benchmarks/backbone_memory.py \\
        --json docs/data/backbone_memory.json
    .venv/bin/python benchmarks/backbone_memory.py --root /tmp/old --size 512
    # a quick check
    .venv/bin/python benchmarks/backbone_memory.py --size 256 --repeats 1
"""
import argparse
import json
import os.path as osp
import statistics
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
BACKBONES = {
    'ResNet-50': dict(type='ResNet', depth=50),
    'AA-ResNet-50': dict(type='AAResNet', depth=50),
    'GSA-ResNet-50': dict(type='GSAResNet', depth=50),
}

WITH_CP = (False, True)


def run_case(name, with_cp, size, root, live):
    """GiB of one case: its peak live tensors if ``live``, else its peak RSS
    growth."""
    sys.path.insert(0, root)
    import resource

    import torch
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import aa_det  # noqa: F401  (registers the backbones)
    assert osp.dirname(osp.dirname(osp.abspath(
        aa_det.__file__))) == osp.abspath(root), aa_det.__file__
    # this file's folder; after aa_det, which stays the one of ``root``
    from op_counts import OpCounter
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(dict(BACKBONES[name], with_cp=with_cp))
    model.train()  # mmdet's ResNet.train returns None
    x = torch.randn(1, 3, size, size)
    if live:
        with OpCounter() as counter:
            sum(f.mean() for f in model(x)).backward()
        return counter.peak / 2**30
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sum(f.mean() for f in model(x)).backward()
    # KiB -> GiB
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--size', type=int, default=1024)
    parser.add_argument(
        '--root', default=ROOT, help='checkout to import aa_det from')
    parser.add_argument(
        '--repeats',
        type=int,
        default=3,
        help='processes per backbone; the median is reported')
    parser.add_argument(
        '--json',
        metavar='FILE',
        help='also write every run and the commit to FILE')
    parser.add_argument('--case', help=argparse.SUPPRESS)
    parser.add_argument(
        '--with-cp', type=int, choices=(0, 1), help=argparse.SUPPRESS)
    parser.add_argument('--live', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(
            json.dumps(
                run_case(args.case, bool(args.with_cp), args.size,
                         osp.abspath(args.root), args.live)))
        return

    def run(name, with_cp, *extra):
        out = subprocess.run([
            sys.executable, __file__, '--case', name, '--with-cp',
            str(int(with_cp)), '--size',
            str(args.size), '--root', args.root, *extra
        ],
                             check=True,
                             capture_output=True,
                             text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    cases = [(name, with_cp) for with_cp in WITH_CP for name in BACKBONES]
    live = {case: run(*case, '--live') for case in cases}
    rss = {case: [] for case in cases}
    # interleaved, so that a slow drift of the machine touches every backbone
    # alike
    for _ in range(args.repeats):
        for case in cases:
            rss[case].append(run(*case))
    median = {case: statistics.median(r) for case, r in rss.items()}
    print(
        f'fp32 forward + backward, 1x3x{args.size}x{args.size}, GiB: peak '
        f'live tensors; peak RSS growth, median of {args.repeats} (min-max); '
        f'ratios to ResNet-50 with the same with_cp ({args.root}):')
    print('| backbone | ' + ' | '.join(f'with_cp={w}: live | with_cp={w}: RSS'
                                       for w in WITH_CP) + ' |')
    print(f'|---|{"---|" * 2 * len(WITH_CP)}')
    for name in BACKBONES:
        cells = []
        for w in WITH_CP:
            r = rss[name, w]
            cells += [
                f'{live[name, w]:.2f} '
                f'({live[name, w] / live["ResNet-50", w]:.2f}x)',
                f'{median[name, w]:.2f} ({min(r):.2f}-{max(r):.2f}, '
                f'{median[name, w] / median["ResNet-50", w]:.2f}x)'
            ]
        print(f'| {name} | {" | ".join(cells)} |')
    if args.json:
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'],
                                capture_output=True,
                                text=True,
                                cwd=args.root).stdout.strip()
        with open(args.json, 'w') as f:
            json.dump(
                dict(
                    benchmark='backbone_memory',
                    commit=commit,
                    size=args.size,
                    repeats=args.repeats,
                    live_gib={
                        str(w): {name: live[name, w]
                                 for name in BACKBONES}
                        for w in WITH_CP
                    },
                    rss_gib={
                        str(w): {name: rss[name, w]
                                 for name in BACKBONES}
                        for w in WITH_CP
                    }),
                f,
                indent=1)


if __name__ == '__main__':
    main()
