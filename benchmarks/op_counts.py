"""Kernel launches, FLOPs, bytes and peak memory of the backbones with the CUDA kernel policy,
measured on the CPU: what a GPU would run, counted without one.

For ResNet-50, AA-ResNet-50 and GSA-ResNet-50 (the from-scratch RetinaNet configs' backbones: GSA in stages
3-4, every stage trains, BatchNorm in training mode; ``--norm-eval`` freezes it as mmdet's ResNet does by
default; ``GSA-ResNet-50, all stages`` is the paper's classification backbone), one backbone forward +
backward (``sum of the outputs' means``) under fp16 autocast (``--amp``: fp16, what ``tools/train.py --amp``
runs on CUDA; bf16; fp32), with ``--policy cuda``: the attention kernels CUDA runs (AA's ``impl='sdpa'``) on
CPU tensors. ``--step`` counts a whole RetinaNet training step instead (the COCO
scratch configs with BatchNorm: backbone, FPN, head, anchor assignment, losses and the backward; one
generated box per image), with mmcv's focal-loss kernel counted as CUDA runs it: one op forward, one
backward. Per model:

* ``ops``: aten ops dispatched (``TorchDispatchMode``, forward and backward), except those
  that launch no kernel on a GPU: views (``OpOverload.is_view``: ``view``, ``transpose``,
  ``expand``, ``slice``, ``detach``, ...), allocations (``empty*``), ops returning no
  tensor (``promote_types``) and Python numbers wrapped as 0-d CPU tensors (``scalar_tensor``,
  e.g. ``torch.where(mask, t, 1.0)``'s ``1.0``: CUDA kernels read it as a host scalar). Every other op is
  one or more kernel launches on CUDA; at these sizes on an H100 each costs ~10-20 us beyond its
  arithmetic. The CPU has no fused kernel for the folded AA attention (its value head dim differs from the key's), so
  ``F.scaled_dot_product_attention`` is counted as CUDA runs it: one op forward, one
  backward (a custom op wrapping the CPU's math kernel, with SDPA's FLOP formulas).
* ``GFLOP``: ``torch.utils.flop_counter.FlopCounterMode`` (GEMMs, convolutions, SDPA).
* ``non-GEMM GiB``: bytes read + written by the ops that are not GEMMs, convolutions or
  attention (casts, copies, pads, concatenations, norms, elementwise): memory traffic.
* ``peak GiB``: the largest sum of live tensor bytes produced by dispatched ops
  (``max_memory_allocated``-like, exact on the CPU; excludes the parameters).

Each is counted on a training step after one learning forward pass at the same size
(``model.train()``, gradients on, none held from a previous step, as after mmengine's ``zero_grad``).

    .venv/bin/python benchmarks/op_counts.py                     # 640x640, batch 2 and 8
    .venv/bin/python benchmarks/op_counts.py --step --batch 8    # whole RetinaNet training steps
    .venv/bin/python benchmarks/op_counts.py --size 320 --batch 2 --top 15 --models GSA-ResNet-50
"""
import argparse
import collections
import contextlib
import os.path as osp
import sys
import weakref

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.flop_counter import (FlopCounterMode, baddbmm_flop, register_flop_formula,  # noqa: E402
                                      sdpa_backward_flop_count, sdpa_flop_count)

BACKBONES = {
    'ResNet-50': dict(type='ResNet', depth=50),
    'AA-ResNet-50': dict(type='AAResNet', depth=50),
    'GSA-ResNet-50': dict(type='GSAResNet', depth=50, stage_with_attention=(False, False, True, True)),  # detection's
    'GSA-ResNet-50, all stages': dict(type='GSAResNet', depth=50),  # the paper's GSA-ResNet-50
}
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: the RetinaNet configs of ``--step``
CONFIGS = {name: osp.join(ROOT, 'configs/retinanet', f'retinanet_{prefix}r50-scratch_fpn_8xb8-ms-150e_coco.py')
           for name, prefix in (('ResNet-50', ''), ('AA-ResNet-50', 'aa-'), ('GSA-ResNet-50', 'gsa-'))}
CONFIGS['GSA-ResNet-50, all stages'] = CONFIGS['GSA-ResNet-50']
AMP = {'fp16': torch.float16, 'bf16': torch.bfloat16, 'fp32': torch.float32}
#: ops whose cost is arithmetic, not memory traffic
GEMM_OPS = ('mm', 'bmm', 'addmm', 'baddbmm', 'convolution', 'convolution_backward', 'mkldnn_convolution',
            '_scaled_dot_product', 'matmul', 'linear')


NO_KERNEL_OPS = ('detach', '_unsafe_view', 'empty', 'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided',
                 'scalar_tensor')
_sdpa = F.scaled_dot_product_attention


@torch.library.custom_op('aa_bench::fused_sdpa', mutates_args=())
def fused_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA as one op, as CUDA's fused kernels run it (computed by the CPU's math kernel)."""
    return _sdpa(q, k, v, scale=scale)


@torch.library.custom_op('aa_bench::fused_sdpa_backward', mutates_args=())
def fused_sdpa_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Its backward as one op (the math kernel's formulas, in float32)."""
    dtype, (g, q, k, v) = q.dtype, (t.float() for t in (grad, q, k, v))
    p = (q @ k.transpose(-1, -2) * scale).softmax(-1)  # [B, Nh, N, N]
    dp = g @ v.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return tuple(t.to(dtype) for t in (ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ g))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.scale = inputs[3]


def _backward(ctx, grad):
    return (*fused_sdpa_backward(grad, *ctx.saved_tensors, ctx.scale), None)


fused_sdpa.register_autograd(_backward, setup_context=_setup_context)


@register_flop_formula(torch.ops.aa_bench.fused_sdpa)
def _fused_sdpa_flops(q_shape, k_shape, v_shape, *args, **kwargs):
    return sdpa_flop_count(q_shape, k_shape, v_shape)


@register_flop_formula(torch.ops.aa_bench.fused_sdpa_backward)
def _fused_sdpa_backward_flops(grad_shape, q_shape, k_shape, v_shape, *args, **kwargs):
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


# the in-place product (GSA's content gradient) as the out-of-place one
register_flop_formula(torch.ops.aten.baddbmm_, get_raw=True)(baddbmm_flop)


def _focal_loss(pred, labels, gamma, alpha):
    """Unreduced sigmoid focal loss of class indices (``num_classes``: background), mmdet's Python form."""
    from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
    target = F.one_hot(labels, pred.size(1) + 1)[:, :pred.size(1)].to(pred.dtype)
    return py_sigmoid_focal_loss(pred, target, gamma=gamma, alpha=alpha, reduction='none')


@torch.library.custom_op('aa_bench::sigmoid_focal_loss', mutates_args=())
def counted_focal_loss(pred: torch.Tensor, labels: torch.Tensor, gamma: float, alpha: float) -> torch.Tensor:
    """mmcv's ``sigmoid_focal_loss`` CUDA kernel (unreduced, labels as indices) as one op."""
    return _focal_loss(pred, labels, gamma, alpha)


@torch.library.custom_op('aa_bench::sigmoid_focal_loss_backward', mutates_args=())
def counted_focal_loss_backward(grad: torch.Tensor, pred: torch.Tensor, labels: torch.Tensor, gamma: float,
                                alpha: float) -> torch.Tensor:
    """Its backward as one op: with ``p = sigmoid(x)``, ``pt`` the probability of the wrong answer and
    ``w = (alpha t + (1 - alpha)(1 - t)) pt^gamma``, ``d loss / dx = (p - t) w + bce dw/dx``."""
    x = pred.float()
    t = F.one_hot(labels, x.size(1) + 1)[:, :x.size(1)].to(x.dtype)
    p = x.sigmoid()
    pt = (1 - p) * t + p * (1 - t)
    a = alpha * t + (1 - alpha) * (1 - t)
    bce = F.binary_cross_entropy_with_logits(x, t, reduction='none')
    dw = a * gamma * pt.pow(gamma - 1) * (1 - 2 * t) * p * (1 - p)
    return (grad.float() * ((p - t) * a * pt.pow(gamma) + bce * dw)).to(pred.dtype)


def _focal_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])
    ctx.gamma, ctx.alpha = inputs[2:]


def _focal_backward(ctx, grad):
    return counted_focal_loss_backward(grad, *ctx.saved_tensors, ctx.gamma, ctx.alpha), None, None, None


counted_focal_loss.register_autograd(_focal_backward, setup_context=_focal_setup)


@contextlib.contextmanager
def cuda_focal_loss(loss_cls):
    """``loss_cls`` (an mmdet ``FocalLoss``) takes its CUDA path, mmcv's kernel counted as one op."""
    from mmdet.models.losses import focal_loss
    kernel = focal_loss._sigmoid_focal_loss

    def forward(pred, target, weight=None, avg_factor=None, reduction_override=None):
        pred = pred.float() if pred.dtype == torch.bfloat16 else pred  # as Float32FocalLoss
        return loss_cls.loss_weight * focal_loss.sigmoid_focal_loss(
            pred, target, weight, gamma=loss_cls.gamma, alpha=loss_cls.alpha,
            reduction=reduction_override or loss_cls.reduction, avg_factor=avg_factor)

    focal_loss._sigmoid_focal_loss = lambda pred, labels, gamma, alpha, *args: counted_focal_loss(
        pred, labels, gamma, alpha)
    loss_cls.forward = forward
    try:
        yield
    finally:
        focal_loss._sigmoid_focal_loss = kernel
        del loss_cls.forward


def _counted_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    assert attn_mask is None and dropout_p == 0 and not is_causal and not kwargs
    return fused_sdpa(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class OpCounter(TorchDispatchMode):
    """Counts non-view aten ops, the bytes of the non-GEMM ones and peak live bytes.

    Live bytes: every storage an op returns is counted from its creation until it is freed
    (a weak reference on the storage's Python object, which lives as long as the storage).
    """

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.bytes = collections.Counter()
        self.live = self.peak = 0
        self._seen = {}

    def _track(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in self._seen:
            return
        size = storage.nbytes()
        self._seen[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)

        def free(key=key, size=size):
            if self._seen.pop(key, None) is not None:
                self.live -= size

        weakref.finalize(storage, free)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split('.')[0]
        if func.is_view or name in NO_KERNEL_OPS or not _tensors(out):
            return out
        self.ops[name] += 1
        if not name.startswith(GEMM_OPS):
            self.bytes[name] += sum(t.numel() * t.element_size() for t in _tensors((args, kwargs, out)))
        for t in _tensors(out):
            self._track(t)
        return out


class SavedForBackward:
    """Bytes a forward saves for its backward, by the innermost module running when each tensor was
    saved (``torch.autograd.graph.saved_tensors_hooks``): distinct storages, parameters excluded, so
    a tensor saved by two ops (a ReLU's output and the next conv's input) counts once, for the first.
    """

    def __init__(self, model):
        self.model, self.names, self.by_module = model, [''], collections.Counter()
        self._skip = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def _pack(self, t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._skip:
            self._skip.add(storage.data_ptr())
            self.by_module[self.names[-1]] += storage.nbytes()
        return t

    def _leave(self, module, args, output):
        self.names.pop()  # returns None: the output is kept

    def __enter__(self):
        self._handles = [h for name, m in self.model.named_modules() for h in (
            m.register_forward_pre_hook(lambda m, args, name=name: self.names.append(name)),
            m.register_forward_hook(self._leave))]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()

    def by_kind(self):
        """Bytes by module path within a residual block (``conv2``, ``conv2.norm_col``,
        ``downsample.1``; the block's own ops ``block``; outside the stages ``stem.<name>``), summed
        over the blocks."""
        kinds = collections.Counter()
        for name, size in self.by_module.items():
            parts = name.split('.')
            if parts[0].startswith('layer'):
                kinds['.'.join(parts[2:]) or ('block' if len(parts) == 2 else 'stage')] += size
            else:
                kinds[f'stem.{name}' if name else 'backbone'] += size
        return kinds


def build(name, step, norm_eval, with_cp):
    """The backbone, or with ``step`` the RetinaNet of its COCO scratch config (BatchNorm in one process)."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    init_default_scope('mmdet')
    if not step:
        return MODELS.build(dict(BACKBONES[name], out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=norm_eval,
                                 with_cp=with_cp))
    cfg = Config.fromfile(CONFIGS[name])
    cfg.model.backbone.update(norm_eval=norm_eval, with_cp=with_cp)
    if cfg.model.backbone.type == 'GSAResNet':  # None: every stage, the class's default
        cfg.model.backbone.stage_with_attention = BACKBONES[name].get('stage_with_attention')
    return revert_sync_batchnorm(MODELS.build(cfg.model))  # one process: BN for the config's SyncBN


def detection_samples(batch, size):
    """One generated box per image, with the metainfo RetinaNet's loss reads."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    samples = []
    for i in range(batch):
        sample = DetDataSample(metainfo=dict(img_shape=(size, size), pad_shape=(size, size),
                                             batch_input_shape=(size, size), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(bboxes=torch.tensor([[0.1, 0.2, 0.5, 0.7]]) * size,
                                           labels=torch.tensor([i % 80]))
        samples.append(sample)
    return samples


def measure(name, size, batch, policy='cuda', dtype=torch.float16, norm_eval=False, with_cp=False, step=False):
    """One backbone forward + backward (with ``step``: one RetinaNet loss + backward); returns ops, FLOPs,
    non-GEMM bytes, peak bytes, op table and the bytes saved for the backward by module kind
    (:class:`SavedForBackward`)."""
    import aa_det  # noqa: F401  (registers the backbones)
    from aa_det.models.layers import AAConv2d
    torch.manual_seed(0)
    model = build(name, step, norm_eval, with_cp)
    model.train()
    for module in model.modules():
        if isinstance(module, AAConv2d) and policy == 'cuda':
            module.impl = 'sdpa'  # the AA kernel CUDA runs
    x = torch.randn(batch, 3, size, size)
    counter, flops, saved = OpCounter(), FlopCounterMode(display=False), SavedForBackward(model)
    if policy == 'cuda':
        F.scaled_dot_product_attention = _counted_sdpa
    if step:
        samples = detection_samples(batch, size)

        def loss():
            return sum(v if isinstance(v, torch.Tensor) else sum(v) for v in model.loss(x, samples).values())
        loss_kernel = cuda_focal_loss(model.bbox_head.loss_cls) if policy == 'cuda' else contextlib.nullcontext()
    else:
        def loss():
            return sum(f.float().mean() for f in model(x))
        loss_kernel = contextlib.nullcontext()

    amp = dict(device_type='cpu', dtype=dtype, enabled=dtype != torch.float32)

    def train_step(record=contextlib.nullcontext()):
        with torch.autocast(**amp), record:  # a new autocast context per step, as in training: weights cast anew
            value = loss()
        value.backward()

    with loss_kernel:
        with torch.autocast(**amp):  # a first pass, as a run's first step
            loss()
        # FLOPs in a pass of their own: FlopCounterMode's module tracking keeps alive what a checkpointed
        # block recomputes in the backward (with_cp: GSA-ResNet-50 at 512x512 peaked at 0.72 GiB, not 0.31)
        with flops:
            train_step()
        # as mmengine's OptimWrapper leaves them after each step (torch's zero_grad(set_to_none=True)): the
        # backward writes each gradient, no accumulation kernel per parameter
        model.zero_grad(set_to_none=True)
        with counter:
            train_step(saved)
    F.scaled_dot_product_attention = _sdpa
    return dict(ops=sum(counter.ops.values()), flops=flops.get_total_flops(),
                bytes=sum(counter.bytes.values()), peak=counter.peak, table=counter.ops,
                bytes_table=counter.bytes, saved=saved.by_kind())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', type=int, default=640)
    parser.add_argument('--batch', type=int, nargs='+', default=[2, 8])
    parser.add_argument('--models', nargs='+', default=list(BACKBONES)[:3], choices=list(BACKBONES),
                        help="default: the three detection backbones; add 'GSA-ResNet-50, all stages'")
    parser.add_argument('--policy', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--amp', default='fp16', choices=list(AMP),
                        help="autocast dtype: fp16 (default, what tools/train.py --amp runs on CUDA), bf16, "
                             "fp32 (no autocast)")
    parser.add_argument('--step', action='store_true',
                        help='count a whole RetinaNet training step (backbone, FPN, head, losses, backward) '
                             'instead of the backbone alone')
    parser.add_argument('--top', type=int, default=0, help='also print the N most frequent ops per model')
    parser.add_argument('--saved', action='store_true',
                        help='also print the bytes saved for the backward, by module kind (SavedForBackward)')
    parser.add_argument('--norm-eval', action='store_true',
                        help="BatchNorm frozen in eval mode (mmdet's ResNet default, for pretrained backbones; "
                             "how the counts before 2026-11-24 were taken); default: BatchNorm "
                             "trains, as in the from-scratch recipe (norm_eval=False)")
    parser.add_argument('--json', metavar='FILE',
                        help='also write the settings, the commit and each model\'s figures as JSON (docs/data/)')
    parser.add_argument('--with-cp', action='store_true',
                        help="mmdet's with_cp: each residual block recomputes its forward in the backward "
                             "(memory for time and launches)")
    args = parser.parse_args()
    dtype = AMP[args.amp]
    what = 'RetinaNet training step' if args.step else 'backbone forward+backward'
    print(f'policy={args.policy} on the CPU, {args.amp if args.amp == "fp32" else args.amp + " autocast"}, {what} '
          f'at {args.size}x{args.size}, BatchNorm {"frozen (norm_eval)" if args.norm_eval else "training"}'
          f'{", with_cp" if args.with_cp else ""}; '
          f'ops = non-view aten ops dispatched')
    print(f'{"model":<26} {"batch":>5} | {"ops":>6} {"x R50":>6} | {"GFLOP":>8} {"x R50":>6} | '
          f'{"non-GEMM GiB":>12} {"x R50":>6} | {"peak GiB":>8} {"x R50":>6}')
    results = {}
    for batch in args.batch:
        base = None
        for name in args.models:
            r = measure(name, args.size, batch, args.policy, dtype, args.norm_eval, args.with_cp, args.step)
            results.setdefault(str(batch), {})[name] = {key: r[key] for key in ('ops', 'flops', 'bytes', 'peak')}
            base = r if name == 'ResNet-50' else base

            def ratio(key, r=r, base=base):
                return f'{r[key] / base[key]:6.2f}' if base else f'{"-":>6}'
            print(f'{name:<26} {batch:>5} | {r["ops"]:6d} {ratio("ops")} | {r["flops"] / 1e9:8.1f} {ratio("flops")} | '
                  f'{r["bytes"] / 2 ** 30:12.2f} {ratio("bytes")} | {r["peak"] / 2 ** 30:8.2f} {ratio("peak")}',
                  flush=True)
            if args.top:
                print('    ' + ', '.join(f'{op} {n} ({r["bytes_table"][op] / 2 ** 30:.2f} GiB)'
                                         for op, n in r['table'].most_common(args.top)))
            if args.saved:
                print(f'    saved for the backward {sum(r["saved"].values()) / 2 ** 30:.3f} GiB: ' +
                      ', '.join(f'{kind} {n / 2 ** 30:.3f}' for kind, n in r['saved'].most_common()))
    if args.json:
        import json
        import subprocess
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        with open(args.json, 'w') as f:
            json.dump(dict(benchmark='op_counts', commit=commit, torch=torch.__version__,
                           settings={k: v for k, v in vars(args).items() if k != 'json'},
                           results_by_batch=results), f, indent=1)


if __name__ == '__main__':
    main()
