"""CPU peak memory of one backbone forward + backward, as a ratio to ResNet-50's.

Each backbone (the class defaults: AA-ResNet-50, GSA-ResNet-50 with attention in every stage) runs in its own
process: one fp32 forward + backward (``sum of the outputs' means``) of a 1x3x1024x1024 image, training mode.
The figure is the growth of the peak RSS (``ru_maxrss``) over the step, after the model and input exist: the
median of ``--repeats`` processes per backbone, as the allocator's threads place blocks differently from run to
run (by up to 0.6 GiB for one backbone).
``--root`` imports ``aa_det`` from another checkout (e.g. a ``git worktree`` of an older commit), so two
versions can be measured side by side.

    .venv/bin/python benchmarks/backbone_memory.py
    .venv/bin/python benchmarks/backbone_memory.py --root /tmp/old --size 512
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


def run_case(name, size, root):
    sys.path.insert(0, root)
    import resource

    import torch
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import aa_det  # noqa: F401  (registers the backbones)
    assert osp.dirname(osp.dirname(osp.abspath(aa_det.__file__))) == osp.abspath(root), aa_det.__file__
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(BACKBONES[name])
    model.train()  # mmdet's ResNet.train returns None
    x = torch.randn(1, 3, size, size)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sum(f.mean() for f in model(x)).backward()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2 ** 20  # KiB -> GiB


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--size', type=int, default=1024)
    parser.add_argument('--root', default=ROOT, help='checkout to import aa_det from')
    parser.add_argument('--repeats', type=int, default=3, help='processes per backbone; the median is reported')
    parser.add_argument('--case', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.size, osp.abspath(args.root))))
        return
    runs = {name: [] for name in BACKBONES}
    for _ in range(args.repeats):  # interleaved, so that a slow drift of the machine touches every backbone alike
        for name in BACKBONES:
            out = subprocess.run([sys.executable, __file__, '--case', name, '--size', str(args.size), '--root',
                                  args.root], check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    peaks = {name: statistics.median(r) for name, r in runs.items()}
    print(f'fp32 forward + backward, 1x3x{args.size}x{args.size}, peak RSS growth, median of {args.repeats} '
          f'(min-max) ({args.root}):')
    for name, peak in peaks.items():
        print(f'{name:15s} {peak:6.2f} GiB ({min(runs[name]):.2f}-{max(runs[name]):.2f})  '
              f'{peak / peaks["ResNet-50"]:.2f}x')


if __name__ == '__main__':
    main()
