"""CPU peak memory of one backbone forward + backward, with ``with_cp`` off and on, as a ratio to ResNet-50's.

Each backbone (the class defaults: AA-ResNet-50, GSA-ResNet-50 with attention in every stage) runs in its own
process, once with ``with_cp=False`` (the default) and once with ``with_cp=True`` (every residual block recomputed
in the backward): one fp32 forward + backward (``sum of the outputs' means``) of a 1x3x1024x1024 image (``--size``),
training mode. Ratios are to ResNet-50 with the same ``with_cp``.
The figure is the growth of the peak RSS (``ru_maxrss``) over the step, after the model and input exist: the
median of ``--repeats`` processes per backbone, as the allocator's threads place blocks differently from run to
run (by up to 0.6 GiB for one backbone).
``--root`` imports ``aa_det`` from another checkout (e.g. a ``git worktree`` of an older commit), so two
versions can be measured side by side.

    .venv/bin/python benchmarks/backbone_memory.py
    .venv/bin/python benchmarks/backbone_memory.py --root /tmp/old --size 512
    .venv/bin/python benchmarks/backbone_memory.py --size 256 --repeats 1   # a quick check
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


def run_case(name, with_cp, size, root):
    sys.path.insert(0, root)
    import resource

    import torch
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import aa_det  # noqa: F401  (registers the backbones)
    assert osp.dirname(osp.dirname(osp.abspath(aa_det.__file__))) == osp.abspath(root), aa_det.__file__
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(dict(BACKBONES[name], with_cp=with_cp))
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
    parser.add_argument('--with-cp', type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, bool(args.with_cp), args.size, osp.abspath(args.root))))
        return
    cases = [(name, with_cp) for with_cp in WITH_CP for name in BACKBONES]
    runs = {case: [] for case in cases}
    for _ in range(args.repeats):  # interleaved, so that a slow drift of the machine touches every backbone alike
        for name, with_cp in cases:
            out = subprocess.run([sys.executable, __file__, '--case', name, '--with-cp', str(int(with_cp)),
                                  '--size', str(args.size), '--root', args.root],
                                 check=True, capture_output=True, text=True).stdout
            runs[name, with_cp].append(json.loads(out.strip().splitlines()[-1]))
    peaks = {case: statistics.median(r) for case, r in runs.items()}
    print(f'fp32 forward + backward, 1x3x{args.size}x{args.size}, peak RSS growth in GiB, median of {args.repeats} '
          f'(min-max), ratio to ResNet-50 with the same with_cp ({args.root}):')
    print(f'| backbone | {" | ".join(f"with_cp={w}" for w in WITH_CP)} |')
    print(f'|---|{"---|" * len(WITH_CP)}')
    for name in BACKBONES:
        cells = []
        for with_cp in WITH_CP:
            r, peak = runs[name, with_cp], peaks[name, with_cp]
            cells.append(f'{peak:.2f} ({min(r):.2f}-{max(r):.2f}), {peak / peaks["ResNet-50", with_cp]:.2f}x')
        print(f'| {name} | {" | ".join(cells)} |')


if __name__ == '__main__':
    main()
