"""Training-step time, peak memory and inference time of RetinaNet with ResNet-50,
AA-ResNet-50 and GSA-ResNet-50, side by side in one run, as ratios to ResNet-50.

Models come from the COCO configs (``configs/retinanet/*-scratch_fpn_8xb8-ms-150e_coco.py``, BN
in one process); inputs are random images with random boxes, so no data is read.

* train: 640x640 crops (the from-scratch recipe's size), ``--batch`` images (default 8 on
  CUDA, the recipe's per-GPU batch; 2 on the CPU), one SGD step (data preprocessor,
  forward, focal + L1 losses, backward, update).
* backbone: the backbone alone, forward + backward on the same batch (where the
  attention kernels' cost shows undiluted by FPN and head).
* infer: one ~1333x800 image (padded to 1344x800), ``mode='predict'`` with NMS.

``--amp``: mmengine's ``AmpOptimWrapper`` (fp16 autocast + dynamic loss scale; ``--amp-dtype bfloat16``:
bf16 autocast, the focal loss in float32) on CUDA, bf16 autocast on the CPU; the kernels pick their
precision per device and dtype (``aa_det/models/layers/aa_conv.py``, ``gsa.py``).
``--compile [MODE]``: the backbone runs ``torch.compile``-d (inductor; MODE ``reduce-overhead`` adds CUDA
graphs, which a launch-bound step may gain from); ``first s`` is the first warm-up
step, compile included. ``--package-root DIR`` imports ``aa_det`` from another checkout with
these configs, to time two versions of the layers side by side. ``--profile DIR``: ``torch.profiler`` tables of three train steps per model
(``DIR/<model>.txt``: ops by device time, and the number of kernels launched).

Each model runs in its own process so that its peak memory is its own
(``torch.cuda.max_memory_allocated`` on CUDA, peak RSS growth on the CPU); ``--repeats N`` runs N processes per
model, interleaved, and reports each figure's median (``runs`` in ``--json`` holds every one).

    .venv/bin/python benchmarks/detection_speed.py --repeats 3      # CPU: 3 processes per model, medians
    .venv/bin/python benchmarks/detection_speed.py --device cuda --steps 20 --amp   # batch 8
    .venv/bin/python benchmarks/detection_speed.py --device cuda --amp --compile --profile OUT
"""
import argparse
import json
import os.path as osp
import resource
import statistics
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = {
    'ResNet-50': 'configs/retinanet/retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py',
    'AA-ResNet-50': 'configs/retinanet/retinanet_aa-r50-scratch_fpn_8xb8-ms-150e_coco.py',
    'GSA-ResNet-50': 'configs/retinanet/retinanet_gsa-r50-scratch_fpn_8xb8-ms-150e_coco.py',
}


def _batch(batch, height, width, device, seed):
    """Random uint8 images and 1-5 random boxes each, through the detector's preprocessor."""
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, height, width), generator=g, dtype=torch.uint8))
        n = int(torch.randint(1, 6, (1,), generator=g))
        xy = torch.rand(n, 2, generator=g) * torch.tensor([width * 0.7, height * 0.7])
        wh = (torch.rand(n, 2, generator=g) * 0.25 + 0.05) * torch.tensor([width, height])
        sample = DetDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width),
                                             scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(bboxes=torch.cat([xy, xy + wh], 1),
                                           labels=torch.randint(0, 80, (n,), generator=g))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _sync(device):
    import torch
    if device == 'cuda':
        torch.cuda.synchronize()


def _median_time(device, steps, warmup, make_input, step_fn):
    """Median seconds of ``step_fn(make_input(i))`` over ``steps`` calls after ``warmup``, and
    the last call's result; inputs are made outside the timed region."""
    times, result = [], None
    for step in range(warmup + steps):
        data = make_input(step)
        _sync(device)
        t0 = time.perf_counter()
        result = step_fn(data)
        _sync(device)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def run_case(name, device, steps, warmup, amp, batch, aa_impl=None, amp_dtype='float16', compile_backbone=None,
             profile=None, size=640):
    """Time ``steps`` training steps and inferences of one model; returns a dict."""
    import torch
    from mmdet.registry import MODELS
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    cfg = Config.fromfile(osp.join(ROOT, CONFIGS[name]))
    if aa_impl and cfg.model.backbone.type == 'AAResNet':
        cfg.model.backbone.attention = dict(impl=aa_impl)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = revert_sync_batchnorm(MODELS.build(cfg.model)).to(device)  # one process: BN for SyncBN
    model.init_weights()
    if compile_backbone:
        model.backbone = torch.compile(model.backbone, mode=compile_backbone)
    optim_cfg = dict(cfg.optim_wrapper)
    if amp:
        optim_cfg.update(dict(type='CPUAmpOptimWrapper') if device == 'cpu' else
                         dict(type='AmpOptimWrapper', loss_scale='dynamic', dtype=amp_dtype))
    optim = build_optim_wrapper(model, optim_cfg)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()

    def train_step(data):
        with optim.optim_context(model):
            losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
        optim.update_params(loss)
        return float(loss)

    def backbone_step(data):
        with optim.optim_context(model):
            feats = model.backbone(data['inputs'])
        sum(f.float().mean() for f in feats).backward()
        optim.zero_grad()

    def train_batch(step):
        return model.data_preprocessor(_batch(batch, size, size, device, step), training=True)

    model.train()
    t0 = time.perf_counter()
    train_step(train_batch(-1))
    _sync(device)
    first_s = time.perf_counter() - t0
    train_s, loss = _median_time(device, steps, warmup, train_batch, train_step)
    if profile:
        _profile(name, device, profile, [train_batch(100 + i) for i in range(3)], train_step)
    if device == 'cuda':
        train_peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    else:
        train_peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 2 ** 20
    backbone_s, _ = _median_time(device, steps, warmup, train_batch, backbone_step)

    model.eval()
    with torch.no_grad():
        infer_s, _ = _median_time(
            device, steps, warmup,
            lambda step: model.data_preprocessor(_batch(1, 800, 1333, device, 1000 + step), training=False),
            lambda data: model(**data, mode='predict'))
    return dict(params_m=params, first_s=first_s, train_s=train_s, train_peak_gib=train_peak, backbone_s=backbone_s,
                infer_s=infer_s, loss=loss)


def _profile(name, device, out_dir, batches, step_fn):
    """``torch.profiler`` of ``step_fn`` over ``batches``: ops by device (CPU) time and the kernels launched."""
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == 'cuda' else [])
    with profile(activities=activities) as prof:
        for data in batches:
            step_fn(data)
        _sync(device)
    key = 'cuda_time_total' if device == 'cuda' else 'cpu_time_total'
    kernels = sum(1 for e in prof.events() if getattr(e, 'device_type', None) == torch.autograd.DeviceType.CUDA)
    os.makedirs(out_dir, exist_ok=True)
    with open(osp.join(out_dir, f'{name}.txt'), 'w') as f:
        f.write(f'{name}: {len(batches)} train steps, {kernels / len(batches):.0f} kernels per step\n')
        f.write(prof.key_averages().table(sort_by=key, row_limit=40))


def _torch_version():
    import torch
    return torch.__version__


def _device_name(device):
    import platform

    import torch
    return torch.cuda.get_device_name() if device == 'cuda' else platform.processor() or platform.machine()


def _print_row(name, r, base):
    """One model's line; ratios to ``base`` (ResNet-50's figures), '-' without it."""
    def ratio(key):
        return f'{r[key] / base[key]:6.2f}' if base else f'{"-":>6}'
    print(f'{name:<14} {r["params_m"]:6.1f}M | {r["first_s"]:7.1f} {r["train_s"]:10.3f} {ratio("train_s")} '
          f'{r["train_peak_gib"]:9.2f} {ratio("train_peak_gib")} | {r["backbone_s"]:8.3f} {ratio("backbone_s")} | '
          f'{r["infer_s"]:8.3f} {ratio("infer_s")}', flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--steps', type=int, default=3, help='timed steps per model (median)')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=1,
                        help='processes per model, interleaved; the median of each figure is reported')
    parser.add_argument('--batch', type=int, help='training images per step (default: 8 on CUDA, 2 on the CPU)')
    parser.add_argument('--amp', action='store_true', help='fp16 (CUDA) / bf16 (CPU) autocast')
    parser.add_argument('--amp-dtype', default='float16', choices=['float16', 'bfloat16'],
                        help='the autocast dtype of --amp on CUDA (the CPU runs bfloat16)')
    parser.add_argument('--compile', nargs='?', const='default', metavar='MODE',
                        help="torch.compile the backbone (inductor) in torch.compile's MODE (default, reduce-overhead: "
                             'CUDA graphs, max-autotune, ...)')
    parser.add_argument('--size', type=int, default=640, help='training crop size (the recipe: 640)')
    parser.add_argument('--json', metavar='FILE', help='also write the settings and results as JSON')
    parser.add_argument('--profile', metavar='DIR', help='write torch.profiler tables of 3 train steps per model')
    parser.add_argument('--models', nargs='+', default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument('--aa-impl', choices=['auto', 'blocked', 'sdpa', 'materialized'],
                        help="AA attention kernel (AAConv2d's impl); default: 'auto'")
    parser.add_argument('--package-root', metavar='DIR',
                        help="import aa_det from DIR (e.g. a git worktree of another commit), with this checkout's "
                             'configs: two versions of the layers side by side')
    parser.add_argument('--case', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 8 if args.device == 'cuda' else 2
    if args.case:
        if args.package_root:
            sys.path.insert(0, osp.abspath(args.package_root))
        import aa_det  # noqa: F401  (registers the backbones)
        if args.package_root:
            assert osp.abspath(aa_det.__file__).startswith(osp.abspath(args.package_root)), aa_det.__file__
        print(json.dumps(run_case(args.case, args.device, args.steps, args.warmup, args.amp, args.batch,
                                  args.aa_impl, args.amp_dtype, args.compile, args.profile, args.size)))
        return
    print(f'device={args.device} amp={args.amp and (args.amp_dtype if args.device == "cuda" else "bfloat16")} '
          f'compile={args.compile} batch={args.batch} aa_impl={args.aa_impl or "auto"}  '
          f'RetinaNet+FPN, 80 classes, BN; median of {args.steps} steps after {args.warmup} warm-up')
    print(f'{"backbone":<14} {"params":>7} | {"first s":>7} {"train s/it":>10} {"x R50":>6} {"peak GiB":>9} {"x R50":>6} | '
          f'{"bb f+b s":>8} {"x R50":>6} | {"infer s":>8} {"x R50":>6}')
    case_args = ['--device', args.device, '--steps', str(args.steps), '--warmup', str(args.warmup), '--batch',
                 str(args.batch)] + (['--amp'] if args.amp else []) \
        + (['--aa-impl', args.aa_impl] if args.aa_impl else []) + ['--amp-dtype', args.amp_dtype] \
        + ['--size', str(args.size)] + (['--compile', args.compile] if args.compile else []) \
        + (['--profile', args.profile] if args.profile else []) \
        + (['--package-root', args.package_root] if args.package_root else [])
    runs = {name: [] for name in args.models}
    for _ in range(args.repeats):  # interleaved, so that a drift of the machine touches every model alike
        for name in args.models:
            out = subprocess.run([sys.executable, __file__, '--case', name] + case_args, capture_output=True, text=True)
            if out.returncode != 0:  # the error's last lines (an inductor error ends in a hint, not the error)
                tail = '\n    '.join(out.stderr.strip().splitlines()[-25:]) or '?'
                print(f'{name:<14} failed (exit {out.returncode}):\n    {tail}', flush=True)
                continue
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            _print_row(name, runs[name][-1], (runs.get('ResNet-50') or [None])[-1])
    results = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items() if rs}
    if args.repeats > 1:
        print(f'median of {args.repeats} runs:')
        for name, r in results.items():
            _print_row(name, r, results.get('ResNet-50'))
    if args.json:
        with open(args.json, 'w') as f:
            commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip()
            json.dump(dict(benchmark='detection_speed', commit=commit, torch=_torch_version(),
                           device_name=_device_name(args.device),
                           settings={k: v for k, v in vars(args).items() if k not in ('case', 'json')},
                           results=results, runs=runs), f, indent=1)


if __name__ == '__main__':
    main()
