"""Training-step time, peak memory and inference time of RetinaNet with
ResNet-50, AA-ResNet-50 and GSA-ResNet-50, side by side in one run, as ratios
to ResNet-50.

Models come from the COCO configs
(``configs/retinanet/*-scratch_fpn_8xb8-ms-150e_coco.py``, BN in one process);
inputs are random images with random boxes, so no data is read.

* train: 640x640 crops (the from-scratch recipe's size; ``--size``),
  ``--batch`` images (default 8 on CUDA, the recipe's per-GPU batch; 2 on the
  CPU), one SGD step (data preprocessor, forward, focal + L1 losses, backward,
  update).
* backbone: the backbone alone, forward + backward on the same batch (where the
  attention kernels' cost shows undiluted by FPN and head).
* infer: one ~1333x800 image (padded to 1344x800; ``--infer-size``),
  ``mode='predict'`` with NMS (``--no-infer``: not run).

``--amp``: mmengine's ``AmpOptimWrapper`` (fp16 autocast + dynamic loss scale;
``--amp-dtype bfloat16``: bf16 autocast, the focal loss in float32) on CUDA,
``CPUAmpOptimWrapper`` (bf16 autocast) on the CPU; the kernels pick their
precision per device and dtype (``aa_det/models/layers/``).
``--compile [MODE]``: the backbone's forward runs ``torch.compile``-d as
``CompileBackboneHook`` compiles it (``fullgraph=True``, ``--no-fullgraph``
lets dynamo break the graph; ``--compile-backend``, inductor by default; MODE
``reduce-overhead`` adds CUDA graphs, which a launch-bound step may gain from);
``first s`` is the first train step, compile included, and ``compile_s`` in
``--json`` that minus a timed step. A compiled run also reports dynamo's
graphs, graph breaks and recompilations and inductor's CUDA-graph skips over
its train and backbone steps. ``--package-root DIR`` imports ``aa_det`` from
another checkout (``--config-root DIR``: its configs too; this checkout's by
default), to time two versions of the layers side by side. ``--profile DIR``:
``torch.profiler`` tables of three train steps per model (``DIR/<model>.txt``:
ops by device time); on CUDA ``kernels_per_step`` (kernels launched) and
``busy`` (the GPU's busy fraction: time covered by kernels per step over the
timed step) in ``--json``.

Each model runs in its own process so that its peak memory is its own
(``torch.cuda.max_memory_allocated`` on CUDA, peak RSS growth on the CPU);
``--repeats N`` runs N processes per model, interleaved, and reports each
figure's median (``runs`` in ``--json`` holds every one). A model whose process
fails is reported (``failed`` in ``--json``: its error's last lines) and the
script exits with 1.

    # CPU: 3 processes per model, medians
    .venv/bin/python benchmarks/detection_speed.py --repeats 3
    .venv/bin/python benchmarks/detection_speed.py --device cuda --steps 20 \\
        --amp  # batch 8
    .venv/bin/python benchmarks/detection_speed.py --device cuda --amp \\
        --compile --profile OUT
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
    'ResNet-50':
    'configs/retinanet/retinanet_r50-scratch_fpn_8xb8-ms-150e_coco.py',
    'AA-ResNet-50':
    'configs/retinanet/retinanet_aa-r50-scratch_fpn_8xb8-ms-150e_coco.py',
    'GSA-ResNet-50':
    'configs/retinanet/retinanet_gsa-r50-scratch_fpn_8xb8-ms-150e_coco.py',
}


def _batch(batch, height, width, device, seed):
    """Random uint8 images and 1-5 random boxes each, through the detector's
    preprocessor."""
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(
            torch.randint(
                0, 256, (3, height, width), generator=g, dtype=torch.uint8))
        n = int(torch.randint(1, 6, (1, ), generator=g))
        xy = torch.rand(
            n, 2, generator=g) * torch.tensor([width * 0.7, height * 0.7])
        wh = (torch.rand(n, 2, generator=g) * 0.25 + 0.05) * torch.tensor(
            [width, height])
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(height, width),
                ori_shape=(height, width),
                scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([xy, xy + wh], 1),
            labels=torch.randint(0, 80, (n, ), generator=g))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _sync(device):
    import torch
    if device == 'cuda':
        torch.cuda.synchronize()


def _median_time(device, steps, warmup, make_input, step_fn):
    """Median seconds of ``step_fn(make_input(i))`` over ``steps`` calls after
    ``warmup``, and the last call's result; inputs are made outside the timed
    region."""
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


def _optim_wrapper(model, cfg, device, amp, amp_dtype):
    """The config's optimizer in the AMP wrapper of ``device``, and a context
    the forward runs in.

    The context is empty but for an ``aa_det`` (``--package-root``) from before
    ``CPUAmpOptimWrapper`` was registered by ``import aa_det``: there the same
    bf16 autocast wraps a plain ``OptimWrapper``'s forward.
    """
    import contextlib

    import torch
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import OPTIM_WRAPPERS
    optim_cfg = dict(cfg.optim_wrapper)
    forward_context = contextlib.nullcontext
    if amp and device == 'cuda':
        optim_cfg.update(
            type='AmpOptimWrapper', loss_scale='dynamic', dtype=amp_dtype)
    elif amp and OPTIM_WRAPPERS.get('CPUAmpOptimWrapper') is not None:
        optim_cfg.update(type='CPUAmpOptimWrapper')
    elif amp:

        def forward_context():
            return torch.autocast('cpu', dtype=torch.bfloat16)

    return build_optim_wrapper(model, optim_cfg), forward_context


def _compile_backbone(model, compile_cfg):
    """``model.backbone``'s forward ``torch.compile``-d as
    ``CompileBackboneHook`` compiles it (the modules' int attributes traced as
    constants on every torch release)."""
    import torch

    from aa_det.utils.compat import module_ints_constant
    compile_cfg = dict(compile_cfg)
    # torch.compile's default; backends but inductor take no mode
    if compile_cfg.get('mode') in (None, 'default'):
        compile_cfg.pop('mode', None)
    model.backbone.forward = module_ints_constant(
        torch.compile(model.backbone.forward, **compile_cfg))


def _dynamo_counts():
    """What dynamo and inductor counted in this process: graphs traced, graph
    breaks, recompilations (guard failures of cached graphs) and CUDA-graph
    skips (``mode='reduce-overhead'``). Each counter that a torch release lacks
    reads 0."""
    from torch._dynamo import utils
    counters = utils.counters  # defaultdict of Counters: a missing key reads 0
    failures = getattr(utils, 'guard_failures', {})
    return dict(
        graphs=counters['stats']['unique_graphs'],
        graph_breaks=sum(counters['graph_break'].values()),
        recompiles=sum(len(reasons) for reasons in failures.values()),
        cudagraph_skips=counters['inductor']['cudagraph_skips'])


def run_case(name,
             device,
             steps,
             warmup,
             amp,
             batch,
             aa_impl=None,
             amp_dtype='float16',
             compile_cfg=None,
             profile=None,
             size=640,
             infer_size=(1333, 800),
             config_root=ROOT):
    """Time ``steps`` training steps and inferences (none with
    ``infer_size=None``) of one model; returns a dict of figures (None where
    not measured)."""
    import platform

    import torch
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(osp.join(config_root, CONFIGS[name]))
    if aa_impl and cfg.model.backbone.type == 'AAResNet':
        cfg.model.backbone.attention = dict(impl=aa_impl)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    # one process: BN for SyncBN
    model = revert_sync_batchnorm(MODELS.build(cfg.model)).to(device)
    model.init_weights()
    if compile_cfg:
        _compile_backbone(model, compile_cfg)
    optim, forward_context = _optim_wrapper(model, cfg, device, amp, amp_dtype)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()

    def train_step(data):
        with optim.optim_context(model), forward_context():
            losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
        optim.update_params(loss)
        return float(loss.detach())

    def backbone_step(data):
        with optim.optim_context(model), forward_context():
            feats = model.backbone(data['inputs'])
        sum(f.float().mean() for f in feats).backward()
        optim.zero_grad()

    def train_batch(step):
        return model.data_preprocessor(
            _batch(batch, size, size, device, step), training=True)

    model.train()
    if compile_cfg:
        from torch._dynamo.utils import counters
        counters.clear()  # counts of this model's compilation only
    t0 = time.perf_counter()
    train_step(train_batch(-1))
    _sync(device)
    first_s = time.perf_counter() - t0
    train_s, loss = _median_time(device, steps, warmup, train_batch,
                                 train_step)
    if device == 'cuda':
        train_peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    else:
        train_peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss -
                      rss0) / 2**20
    backbone_s, _ = _median_time(device, steps, warmup, train_batch,
                                 backbone_step)
    # before inference, whose eval mode compiles anew
    counts = _dynamo_counts() if compile_cfg else {}

    infer_s = None
    if infer_size:
        model.eval()
        with torch.no_grad():
            infer_s, _ = _median_time(
                device, steps, warmup, lambda step: model.data_preprocessor(
                    _batch(1, infer_size[1], infer_size[0], device, 1000 + step
                           ),
                    training=False),
                lambda data: model(**data, mode='predict'))
    kernels = kernel_s = profile_error = None
    # last: nothing timed runs after the profiler, and the figures above
    # outlive its failure
    if profile:
        model.train()
        try:
            kernels, kernel_s = _profile(
                name, device, profile,
                [train_batch(100 + i) for i in range(3)], train_step)
        # (the profiler's, e.g. CUPTI's, on an untried stack)
        except Exception as error:  # noqa: BLE001
            profile_error = f'{type(error).__name__}: {error}'.splitlines()[0]
            print(f'{name}: profile failed: {profile_error}', file=sys.stderr)
    return dict(
        params_m=params,
        first_s=first_s,
        train_s=train_s,
        train_peak_gib=train_peak,
        backbone_s=backbone_s,
        infer_s=infer_s,
        loss=loss,
        kernels_per_step=kernels,
        busy=kernel_s / train_s if kernel_s is not None else None,
        profile_error=profile_error,
        compile_s=first_s - train_s if compile_cfg else None,
        **counts,
        torch=torch.__version__,
        device_name=torch.cuda.get_device_name()
        if device == 'cuda' else platform.processor() or platform.machine())


def _profile(name, device, out_dir, batches, step_fn):
    """``torch.profiler`` of ``step_fn`` over ``batches``: a table of ops by
    device (CPU) time in ``out_dir/<name>.txt``; on CUDA returns the kernels
    launched per step and the seconds per step in which at least one kernel ran
    (overlapping kernels counted once), (None, None) on the CPU."""
    import os

    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU
                  ] + ([ProfilerActivity.CUDA] if device == 'cuda' else [])
    with profile(activities=activities) as prof:
        for data in batches:
            step_fn(data)
        _sync(device)
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in prof.events()
        if getattr(e, 'device_type', None) == torch.autograd.DeviceType.CUDA)
    busy_us, end = 0, float('-inf')
    for start, stop in spans:  # the union of the kernels' intervals
        if stop > end:
            busy_us += stop - max(start, end)
            end = stop
    kernels = len(spans) / len(batches)
    key = 'cuda_time_total' if device == 'cuda' else 'cpu_time_total'
    os.makedirs(out_dir, exist_ok=True)
    with open(osp.join(out_dir, f'{name}.txt'), 'w') as f:
        f.write(f'{name}: {len(batches)} train steps' +
                (f', {kernels:.0f} kernels per step\n' if device ==
                 'cuda' else '\n'))
        f.write(prof.key_averages().table(sort_by=key, row_limit=40))
    return (kernels,
            busy_us / 1e6 / len(batches)) if device == 'cuda' else (None, None)


def _print_row(name, r, base):
    """One model's line; ratios to ``base`` (ResNet-50's figures), '-' without
    it or a figure."""

    def value(key, form):
        return f'{r[key]:{form}}' if r.get(
            key) is not None else f'{"-":>{form.split(".")[0]}}'

    def ratio(key):
        return f'{r[key] / base[key]:6.2f}' if base and r.get(
            key) is not None else f'{"-":>6}'

    print(
        f'{name:<14} {r["params_m"]:6.1f}M | {r["first_s"]:7.1f} '
        f'{r["train_s"]:10.3f} {ratio("train_s")} {r["train_peak_gib"]:9.2f} '
        f'{ratio("train_peak_gib")} | {r["backbone_s"]:8.3f} '
        f'{ratio("backbone_s")} | {value("infer_s", "8.3f")} '
        f'{ratio("infer_s")}',
        flush=True)


def _median(runs):
    """Each number's median over ``runs`` (dicts of one model), None where no
    run has it; any other value is the first run's that has one."""
    merged = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r.get(key) is not None]
        if not values:
            merged[key] = None
        elif all(isinstance(v, (int, float)) for v in values):
            merged[key] = statistics.median(values)
        else:
            merged[key] = values[0]
    return merged


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument(
        '--steps', type=int, default=3, help='timed steps per model (median)')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument(
        '--repeats',
        type=int,
        default=1,
        help='processes per model, interleaved; the median of each figure is '
        'reported')
    parser.add_argument(
        '--batch',
        type=int,
        help='training images per step (default: 8 on CUDA, 2 on the CPU)')
    parser.add_argument(
        '--amp', action='store_true', help='fp16 (CUDA) / bf16 (CPU) autocast')
    parser.add_argument(
        '--amp-dtype',
        default='float16',
        choices=['float16', 'bfloat16'],
        help='the autocast dtype of --amp on CUDA (the CPU runs bfloat16)')
    parser.add_argument(
        '--compile',
        nargs='?',
        const='default',
        metavar='MODE',
        help="torch.compile the backbone's forward in torch.compile's MODE "
        "(default, reduce-overhead: "
        'CUDA graphs, max-autotune, ...)')
    parser.add_argument(
        '--no-fullgraph',
        action='store_true',
        help='--compile with fullgraph=False')
    parser.add_argument(
        '--compile-backend',
        default='inductor',
        help="torch.compile's backend (eager, aot_eager: dynamo's trace "
        "without inductor's codegen)")
    parser.add_argument(
        '--size',
        type=int,
        default=640,
        help='training crop size (the recipe: 640)')
    parser.add_argument(
        '--infer-size',
        type=int,
        nargs=2,
        default=[1333, 800],
        metavar=('W', 'H'),
        help='the inference image (default: 1333 800)')
    parser.add_argument(
        '--no-infer', action='store_true', help='time no inference')
    parser.add_argument(
        '--json',
        metavar='FILE',
        help='also write the settings and results as JSON')
    parser.add_argument(
        '--profile',
        metavar='DIR',
        help='write torch.profiler tables of 3 train steps per model')
    parser.add_argument(
        '--models', nargs='+', default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument(
        '--aa-impl',
        choices=['auto', 'blocked', 'sdpa', 'materialized'],
        help="AA attention kernel (AAConv2d's impl); default: 'auto'")
    parser.add_argument(
        '--package-root',
        metavar='DIR',
        help='import aa_det from DIR (e.g. a git worktree of another commit, '
        'or the export of benchmarks/prepare_baseline.sh): two versions '
        'of the layers side by side')
    parser.add_argument(
        '--config-root',
        metavar='DIR',
        help="read the models' configs from DIR/configs (default: this "
        "checkout's)")
    parser.add_argument('--case', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 8 if args.device == 'cuda' else 2
    if args.case:
        if args.package_root:
            sys.path.insert(0, osp.abspath(args.package_root))
        import aa_det  # noqa: F401  (registers the backbones)
        if args.package_root:
            assert osp.abspath(aa_det.__file__).startswith(
                osp.abspath(args.package_root)), aa_det.__file__
        compile_cfg = dict(
            mode=args.compile,
            backend=args.compile_backend,
            fullgraph=not args.no_fullgraph) if args.compile else None
        print(
            json.dumps(
                run_case(args.case, args.device, args.steps, args.warmup,
                         args.amp, args.batch, args.aa_impl, args.amp_dtype,
                         compile_cfg, args.profile, args.size,
                         None if args.no_infer else args.infer_size,
                         osp.abspath(args.config_root or ROOT))))
        return
    amp_text = args.amp and (args.amp_dtype
                             if args.device == 'cuda' else 'bfloat16')
    compile_text = (
        args.compile and f'{args.compile},{args.compile_backend}'
        f',fullgraph={not args.no_fullgraph}')
    print(f'device={args.device} amp={amp_text} compile={compile_text} '
          f'batch={args.batch} size={args.size} '
          f'aa_impl={args.aa_impl or "auto"}  RetinaNet+FPN, 80 classes, BN; '
          f'median of {args.steps} steps after {args.warmup} warm-up')
    print(
        f'{"backbone":<14} {"params":>7} | {"first s":>7} {"train s/it":>10} '
        f'{"x R50":>6} {"peak GiB":>9} {"x R50":>6} | {"bb f+b s":>8} '
        f'{"x R50":>6} | {"infer s":>8} {"x R50":>6}')
    case_args = (
        [
            '--device', args.device, '--steps',
            str(args.steps), '--warmup',
            str(args.warmup), '--batch',
            str(args.batch)
        ] + (['--amp'] if args.amp else []) +
        (['--aa-impl', args.aa_impl] if args.aa_impl else []) +
        ['--amp-dtype', args.amp_dtype] +
        ['--size', str(args.size), '--infer-size'] +
        [str(s) for s in args.infer_size] +
        (['--no-infer'] if args.no_infer else []) + ([
            '--compile', args.compile, '--compile-backend',
            args.compile_backend
        ] if args.compile else []) +
        (['--no-fullgraph'] if args.no_fullgraph else []) +
        (['--profile', args.profile] if args.profile else []) +
        (['--package-root', args.package_root] if args.package_root else []) +
        (['--config-root', args.config_root] if args.config_root else []))
    runs, failed = {name: [] for name in args.models}, {}
    # interleaved, so that a drift of the machine touches every model alike
    for _ in range(args.repeats):
        for name in args.models:
            out = subprocess.run(
                [sys.executable, __file__, '--case', name] + case_args,
                capture_output=True,
                text=True)
            # the error's last lines (an inductor error ends in a hint, not the
            # error)
            if out.returncode != 0:
                tail = out.stderr.strip().splitlines()[-25:] or ['?']
                failed.setdefault(name, []).append(f'exit {out.returncode}: ' +
                                                   '\n'.join(tail))
                print(
                    f'{name:<14} failed (exit {out.returncode}):\n    ' +
                    '\n    '.join(tail),
                    flush=True)
                continue
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            _print_row(name, runs[name][-1], (runs.get('ResNet-50')
                                              or [None])[-1])
    results = {name: _median(rs) for name, rs in runs.items() if rs}
    if args.repeats > 1:
        print(f'median of {args.repeats} runs:')
        for name, r in results.items():
            _print_row(name, r, results.get('ResNet-50'))
    if args.json:
        with open(args.json, 'w') as f:
            commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'],
                                    capture_output=True,
                                    text=True,
                                    cwd=ROOT).stdout.strip()
            first = next(iter(results.values()), {})
            json.dump(
                dict(
                    benchmark='detection_speed',
                    commit=commit,
                    torch=first.get('torch'),
                    device_name=first.get('device_name'),
                    settings={
                        k: v
                        for k, v in vars(args).items()
                        if k not in ('case', 'json')
                    },
                    results=results,
                    runs=runs,
                    failed=failed),
                f,
                indent=1)
    if failed:
        print(f'failed: {", ".join(failed)}', file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    main()
