"""Kernel launches, FLOPs, bytes and peak memory of the backbones with the CUDA kernel policy,
measured on the CPU (issue 19): what a GPU would run, counted without one.

For ResNet-50, AA-ResNet-50 and GSA-ResNet-50 (the from-scratch RetinaNet recipe's backbone
settings: every stage trains, BatchNorm in training mode; ``--norm-eval`` freezes it as mmdet's
ResNet does by default), one backbone forward + backward (``sum of the outputs' means``) under
bf16 autocast, with
``force_policy('cuda')``: the attention kernels, dtypes and chunk sizes the CUDA path picks,
run on CPU tensors. Per backbone:

* ``ops``: aten ops dispatched (``TorchDispatchMode``, forward and backward), except those
  that launch no kernel on a GPU: views (``OpOverload.is_view``: ``view``, ``transpose``,
  ``expand``, ``slice``, ``detach``, ...), allocations (``empty*``) and ops returning no
  tensor (``promote_types``). Every other op is one or more kernel launches on CUDA; at
  these sizes on an H100 each costs ~10-20 us beyond its arithmetic. The CPU has no fused
  kernel for the folded AA attention (its value head dim differs from the key's), so
  ``F.scaled_dot_product_attention`` is counted as CUDA runs it: one op forward, one
  backward (a custom op wrapping the CPU's math kernel, with SDPA's FLOP formulas).
* ``GFLOP``: ``torch.utils.flop_counter.FlopCounterMode`` (GEMMs, convolutions, SDPA).
* ``non-GEMM GiB``: bytes read + written by the ops that are not GEMMs, convolutions or
  attention (casts, copies, pads, concatenations, norms, elementwise): memory traffic.
* ``peak GiB``: the largest sum of live tensor bytes produced by dispatched ops
  (``max_memory_allocated``-like, exact on the CPU; excludes the parameters).

Each is counted on a training step after one learning forward pass at the same size
(``model.train()``, gradients on): the first pass at a new size also builds the constants that
are cached per size (AA's one-hot fold columns, the relative-offset indices of both
architectures; ``relative_attention._fold_columns``, ``relative_embeddings``), a few ops per
layer once.

    .venv/bin/python benchmarks/op_counts.py                     # 640x640, batch 2 and 8
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
from torch.utils.flop_counter import (FlopCounterMode, register_flop_formula, sdpa_backward_flop_count,  # noqa: E402
                                      sdpa_flop_count)

BACKBONES = {
    'ResNet-50': dict(type='ResNet', depth=50),
    'AA-ResNet-50': dict(type='AAResNet', depth=50),
    'GSA-ResNet-50': dict(type='GSAResNet', depth=50),
}
#: ops whose cost is arithmetic, not memory traffic
GEMM_OPS = ('mm', 'bmm', 'addmm', 'baddbmm', 'convolution', 'convolution_backward', 'mkldnn_convolution',
            '_scaled_dot_product', 'matmul', 'linear')


NO_KERNEL_OPS = ('detach', '_unsafe_view', 'empty', 'empty_like', 'empty_strided', 'new_empty')
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


def measure(name, size, batch, policy='cuda', dtype=torch.bfloat16, norm_eval=False, with_cp=False):
    """One backbone forward + backward; returns ops, FLOPs, non-GEMM bytes, peak bytes, op table
    and the bytes saved for the backward by module kind (:class:`SavedForBackward`)."""
    from mmdet.registry import MODELS

    import aa_det  # noqa: F401  (registers the backbones)
    from aa_det.models.layers.kernel_policy import force_policy
    torch.manual_seed(0)
    model = MODELS.build(dict(BACKBONES[name], out_indices=(0, 1, 2, 3), frozen_stages=-1, norm_eval=norm_eval,
                              with_cp=with_cp))
    model.train()
    x = torch.randn(batch, 3, size, size)
    counter, flops, saved = OpCounter(), FlopCounterMode(display=False), SavedForBackward(model)
    if policy == 'cuda':
        F.scaled_dot_product_attention = _counted_sdpa

    amp = dict(device_type='cpu', dtype=dtype, enabled=dtype != torch.float32)

    def step(record=contextlib.nullcontext()):
        with torch.autocast(**amp), record:  # a new autocast context per step, as in training: weights cast anew
            feats = model(x)
        sum(f.float().mean() for f in feats).backward()

    with force_policy(policy):
        with torch.autocast(**amp):  # a size's first learning pass builds the cached constants
            model(x)
        # FLOPs in a pass of their own: FlopCounterMode's module tracking keeps alive what a checkpointed
        # block recomputes in the backward (with_cp: GSA-ResNet-50 at 512x512 peaked at 0.72 GiB, not 0.31)
        with flops:
            step()
        with counter:
            step(saved)
    F.scaled_dot_product_attention = _sdpa
    return dict(ops=sum(counter.ops.values()), flops=flops.get_total_flops(),
                bytes=sum(counter.bytes.values()), peak=counter.peak, table=counter.ops,
                bytes_table=counter.bytes, saved=saved.by_kind())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', type=int, default=640)
    parser.add_argument('--batch', type=int, nargs='+', default=[2, 8])
    parser.add_argument('--models', nargs='+', default=list(BACKBONES), choices=list(BACKBONES))
    parser.add_argument('--policy', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--fp32', action='store_true', help='no autocast (default: bf16 autocast)')
    parser.add_argument('--top', type=int, default=0, help='also print the N most frequent ops per model')
    parser.add_argument('--saved', action='store_true',
                        help='also print the bytes saved for the backward, by module kind (SavedForBackward)')
    parser.add_argument('--norm-eval', action='store_true',
                        help="BatchNorm frozen in eval mode (mmdet's ResNet default, for pretrained backbones; "
                             "how the counts before 2026-11-24 were taken); default: BatchNorm "
                             "trains, as in the from-scratch recipe (norm_eval=False)")
    parser.add_argument('--with-cp', action='store_true',
                        help="mmdet's with_cp: each residual block recomputes its forward in the backward "
                             "(memory for time and launches)")
    args = parser.parse_args()
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    print(f'policy={args.policy} on the CPU, {"fp32" if args.fp32 else "bf16 autocast"}, backbone forward+backward '
          f'at {args.size}x{args.size}, BatchNorm {"frozen (norm_eval)" if args.norm_eval else "training"}'
          f'{", with_cp" if args.with_cp else ""}; '
          f'ops = non-view aten ops dispatched')
    print(f'{"backbone":<14} {"batch":>5} | {"ops":>6} {"x R50":>6} | {"GFLOP":>8} {"x R50":>6} | '
          f'{"non-GEMM GiB":>12} {"x R50":>6} | {"peak GiB":>8} {"x R50":>6}')
    for batch in args.batch:
        base = None
        for name in args.models:
            r = measure(name, args.size, batch, args.policy, dtype, args.norm_eval, args.with_cp)
            base = r if name == 'ResNet-50' else base

            def ratio(key, r=r, base=base):
                return f'{r[key] / base[key]:6.2f}' if base else f'{"-":>6}'
            print(f'{name:<14} {batch:>5} | {r["ops"]:6d} {ratio("ops")} | {r["flops"] / 1e9:8.1f} {ratio("flops")} | '
                  f'{r["bytes"] / 2 ** 30:12.2f} {ratio("bytes")} | {r["peak"] / 2 ** 30:8.2f} {ratio("peak")}',
                  flush=True)
            if args.top:
                print('    ' + ', '.join(f'{op} {n} ({r["bytes_table"][op] / 2 ** 30:.2f} GiB)'
                                         for op, n in r['table'].most_common(args.top)))
            if args.saved:
                print(f'    saved for the backward {sum(r["saved"].values()) / 2 ** 30:.3f} GiB: ' +
                      ', '.join(f'{kind} {n / 2 ** 30:.3f}' for kind, n in r['saved'].most_common()))


if __name__ == '__main__':
    main()
