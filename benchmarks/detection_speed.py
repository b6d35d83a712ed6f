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

``--amp``: mmengine's ``AmpOptimWrapper`` (fp16 autocast + dynamic loss scale) on CUDA,
bf16 autocast on the CPU; the kernels pick their precision per device and dtype
(``aa_det/models/layers/relative_attention.py``, ``gsa.py``).

Each model runs in its own process so that its peak memory is its own
(``torch.cuda.max_memory_allocated`` on CUDA, peak RSS growth on the CPU).

    .venv/bin/python benchmarks/detection_speed.py                  # CPU
    .venv/bin/python benchmarks/detection_speed.py --device cuda --steps 20 --amp   # batch 8
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


def run_case(name, device, steps, warmup, amp, batch, aa_impl=None):
    """Time ``steps`` training steps and inferences of one model; returns a dict."""
    import torch
    from mmdet.registry import MODELS
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope

    from aa_det.engine import load_config
    cfg = load_config(osp.join(ROOT, CONFIGS[name]))
    if aa_impl and cfg.model.backbone.type == 'AAResNet':
        cfg.model.backbone.attention = dict(impl=aa_impl)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).to(device)
    model.init_weights()
    optim_cfg = dict(cfg.optim_wrapper)
    if amp:
        optim_cfg.update(type='AmpOptimWrapper',
                         **({'dtype': 'bfloat16'} if device == 'cpu' else {'loss_scale': 'dynamic'}))
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
        return model.data_preprocessor(_batch(batch, 640, 640, device, step), training=True)

    model.train()
    train_s, loss = _median_time(device, steps, warmup, train_batch, train_step)
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
    return dict(params_m=params, train_s=train_s, train_peak_gib=train_peak, backbone_s=backbone_s,
                infer_s=infer_s, loss=loss)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--steps', type=int, default=3, help='timed steps per model (median)')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--batch', type=int, help='training images per step (default: 8 on CUDA, 2 on the CPU)')
    parser.add_argument('--amp', action='store_true', help='fp16 (CUDA) / bf16 (CPU) autocast')
    parser.add_argument('--models', nargs='+', default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument('--aa-impl', choices=['auto', 'blocked', 'sdpa', 'materialized'],
                        help="AA attention kernel (AAConv2d's impl); default: 'auto'")
    parser.add_argument('--case', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 8 if args.device == 'cuda' else 2
    if args.case:
        import aa_det  # noqa: F401  (registers the backbones)
        print(json.dumps(run_case(args.case, args.device, args.steps, args.warmup, args.amp, args.batch,
                                  args.aa_impl)))
        return
    print(f'device={args.device} amp={args.amp} batch={args.batch} aa_impl={args.aa_impl or "auto"}  '
          f'RetinaNet+FPN, 80 classes, BN; median of {args.steps} steps after {args.warmup} warm-up')
    print(f'{"backbone":<14} {"params":>7} | {"train s/it":>10} {"x R50":>6} {"peak GiB":>9} {"x R50":>6} | '
          f'{"bb f+b s":>8} {"x R50":>6} | {"infer s":>8} {"x R50":>6}')
    base = None
    for name in args.models:
        cmd = [sys.executable, __file__, '--case', name, '--device', args.device, '--steps', str(args.steps),
               '--warmup', str(args.warmup), '--batch', str(args.batch)] + (['--amp'] if args.amp else []) \
            + (['--aa-impl', args.aa_impl] if args.aa_impl else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f'{name:<14} failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "?"}')
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        base = r if name == 'ResNet-50' else base

        def ratio(key):  # '-' when ResNet-50 was not measured first
            return f'{r[key] / base[key]:6.2f}' if base else f'{"-":>6}'
        print(f'{name:<14} {r["params_m"]:6.1f}M | {r["train_s"]:10.3f} {ratio("train_s")} '
              f'{r["train_peak_gib"]:9.2f} {ratio("train_peak_gib")} | '
              f'{r["backbone_s"]:8.3f} {ratio("backbone_s")} | '
              f'{r["infer_s"]:8.3f} {ratio("infer_s")}', flush=True)


if __name__ == '__main__':
    main()
