"""Kernel launches, FLOPs, bytes and peak memory of the backbones on the CUDA
path, counted on the CPU: what a GPU would run, counted without one, at any
size.

For ResNet-50, AA-ResNet-50 and GSA-ResNet-50 (the from-scratch RetinaNet
configs' backbones: GSA in stages 3-4, every stage trains, BatchNorm in
training mode; ``--norm-eval`` freezes it as mmdet's ResNet does by default;
``GSA-ResNet-50, all stages`` is the paper's classification backbone), one
backbone forward + backward (``sum of the outputs' means``) under autocast
(``--amp``: fp16, what ``tools/train.py --amp`` runs on CUDA; bf16; fp32), with
``--policy cuda``: the layers take CUDA's kernels, chunk sizes and dtypes on
CPU tensors (:func:`aa_det.models.layers.device_policy.forced_device_policy`).

The tensors are fake (``FakeTensorMode``: shapes, dtypes and strides, no data,
no arithmetic), so any size counts in seconds; ``--real`` runs real CPU tensors
instead (minutes at 640x640 batch 8), for checking that both count the same
(tests/test_op_counts.py). A fused kernel the CPU cannot run is a stand-in op,
one op forward and one backward, whose FLOP formula counts the shapes the GPU
kernel runs:

* AA's FlexAttention (``aa_conv.attention_flex``, torch >= 2.6):
  :func:`flex_attention_flops`;
* ``F.scaled_dot_product_attention`` (AA's folded kernel on older torch):
  SDPA's own formulas.

``--step`` counts a whole RetinaNet training step instead (the COCO scratch
configs with BatchNorm: backbone, FPN, head, anchor assignment, losses and the
backward; one generated box per image), with mmcv's focal-loss kernel counted
as CUDA runs it, one op forward, one backward; on real tensors only (the anchor
assignment depends on the data). Per model:

* ``ops``: aten ops dispatched (``TorchDispatchMode``, forward and backward),
  except those that launch no kernel on a GPU: views (``OpOverload.is_view``:
  ``view``, ``transpose``, ``expand``, ``slice``, ``detach``, ...), allocations
  (``empty*``), ops returning no tensor (``promote_types``) and Python numbers
  wrapped as 0-d CPU tensors (``scalar_tensor``, e.g.
  ``torch.where(mask, t, 1.0)``'s ``1.0``: CUDA kernels read it as a host
  scalar). Every other op is one or more kernel launches on CUDA; at these
  sizes on an H100 each costs ~10-20 us beyond its arithmetic.
* ``GFLOP``: ``torch.utils.flop_counter``'s formulas (GEMMs, convolutions,
  SDPA, the stand-ins' formulas); those of the attention kernels alone are
  printed on the layer line (``attention_flops`` in ``--json``).
* ``non-GEMM GiB``: bytes read + written by the ops that are not GEMMs,
  convolutions or attention (casts, copies, pads, concatenations, norms,
  elementwise): memory traffic.
* ``peak GiB``: the largest sum of live tensor bytes produced by dispatched ops
  (``max_memory_allocated``-like; excludes the parameters).
* ``--by-kind``: ops and non-GEMM bytes by kind (:func:`op_kind`): ``gemm``
  (GEMMs, convolutions, attention), ``cast`` (dtype conversions), ``layout``
  (copies, concatenations, pads), ``index`` (gathers, scatters, index tables)
  and ``elementwise`` (the rest: arithmetic, activations, norms, reductions,
  fills).
* per layer: the ops of one module's forward + backward (``--layer``, default
  ``layer3.0.conv2``: an attention layer of each attention backbone, a 3x3
  convolution of ResNet-50) and their mean over the attention layers. Forward
  ops belong to the innermost module running; backward ops to the module whose
  forward created the autograd node running them, a forward recomputed there
  (``--with-cp``) to its module (:class:`ModuleScopes`).

Each is counted on a training step after one learning forward pass at the same
size (``model.train()``, gradients on, none held from a previous step, as after
mmengine's ``zero_grad``): tables computed once per size are not counted.

``--json`` writes ``commit``, ``torch``, ``settings`` and the figures of each
model by size and batch (``results_by_size``; ``results_by_batch``: the first
size's): ``ops``, ``flops``, ``bytes``, ``peak``, ``kinds`` (``ops``,
``bytes``, ``flops`` by kind) and ``layers`` (each attention layer's and
``--layer``'s ``ops``, ``ops_forward``, ``ops_backward``, ``flops`` and
``kinds``: ops by kind).

``--size`` takes ``S`` (S x S) or ``WxH``, width first as mmdet's scales
(``1333x800``: 1333 wide, 800 high); the input is padded to a multiple of
``--pad-divisor`` (32, the configs' ``DetDataPreprocessor``), as a GPU runs it:
1333x800 is counted as 1344x800.

    .venv/bin/python benchmarks/op_counts.py --size 320 640 1333x800 \\
        --batch 2 8 --amp bf16 --by-kind
    .venv/bin/python benchmarks/op_counts.py --size 320 --batch 2 --top 15 \\
        --models GSA-ResNet-50
    # whole RetinaNet training steps (real tensors)
    .venv/bin/python benchmarks/op_counts.py --step --batch 8
"""
import argparse
import bisect
import collections
import contextlib
import os.path as osp
import sys
import time
import weakref
from typing import Optional, Tuple

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.flop_counter import baddbmm_flop  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402
from torch.utils.flop_counter import register_flop_formula  # noqa: E402
from torch.utils.flop_counter import sdpa_backward_flop_count  # noqa: E402
from torch.utils.flop_counter import sdpa_flop_count  # noqa: E402

BACKBONES = {
    'ResNet-50':
    dict(type='ResNet', depth=50),
    'AA-ResNet-50':
    dict(type='AAResNet', depth=50),
    # detection's
    'GSA-ResNet-50':
    dict(
        type='GSAResNet',
        depth=50,
        stage_with_attention=(False, False, True, True)),
    # the paper's GSA-ResNet-50
    'GSA-ResNet-50, all stages':
    dict(type='GSAResNet', depth=50),
}
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: the RetinaNet configs of ``--step``
CONFIGS = {
    name: osp.join(ROOT, 'configs/retinanet',
                   f'retinanet_{prefix}r50-scratch_fpn_8xb8-ms-150e_coco.py')
    for name, prefix in (('ResNet-50', ''), ('AA-ResNet-50', 'aa-'),
                         ('GSA-ResNet-50', 'gsa-'))
}
CONFIGS['GSA-ResNet-50, all stages'] = CONFIGS['GSA-ResNet-50']
AMP = {'fp16': torch.float16, 'bf16': torch.bfloat16, 'fp32': torch.float32}

NO_KERNEL_OPS = ('detach', '_unsafe_view', 'empty', 'empty_like',
                 'empty_strided', 'new_empty', 'new_empty_strided',
                 'scalar_tensor')
#: op kinds, in table order (:func:`op_kind`)
KINDS = ('gemm', 'cast', 'layout', 'index', 'elementwise')
#: ops whose cost is arithmetic, not memory traffic (names by prefix), and the
#: attention stand-ins
GEMM_OPS = ('mm', 'bmm', 'addmm', 'baddbmm', 'convolution',
            'convolution_backward', 'mkldnn_convolution',
            '_scaled_dot_product', 'matmul', 'linear', 'fused_sdpa',
            'flex_attention')
#: the attention kernels among them (forward and backward)
ATTENTION_OPS = ('_scaled_dot_product', 'fused_sdpa', 'flex_attention')
CAST_OPS = {
    '_to_copy', 'to', '_autocast_to_reduced_precision',
    '_autocast_to_full_precision'
}
#: ops that move or lay out data without arithmetic (a ``permute``'s copy is a
#: ``clone``, ``contiguous``'s too)
LAYOUT_OPS = {
    'clone', 'copy', 'contiguous', 'cat', 'stack', 'constant_pad_nd', 'pad',
    'reflection_pad2d', 'replication_pad2d', 'repeat', 'roll', 'flip',
    'slice_backward', 'select_backward', 'slice_scatter', 'select_scatter',
    'as_strided_scatter', 'diagonal_backward', 'narrow_copy', 'expand_copy',
    'permute_copy', 'transpose_copy', 'view_copy', 'unfold_backward', 'im2col',
    'col2im', 'lift_fresh_copy', 'split_with_sizes_copy', 'unbind_copy',
    'pixel_shuffle', 'pixel_unshuffle'
}
#: ops that gather, scatter or build indices
INDEX_OPS = {
    'index', 'index_select', 'index_add', 'index_copy', 'index_fill',
    'index_put', '_index_put_impl', '_unsafe_index', '_unsafe_index_put',
    'gather', 'scatter', 'scatter_add', 'scatter_reduce', 'take', 'arange',
    'linspace', 'range', 'embedding', 'embedding_dense_backward', 'one_hot',
    'nonzero', 'masked_select', 'masked_scatter', 'sort', 'argsort', 'topk',
    'unique', '_unique2', 'searchsorted', 'bucketize', 'tril_indices',
    'triu_indices', 'randperm'
}


def op_kind(name, args=()):
    """The kind (:data:`KINDS`) of aten op ``name`` (``func.__name__``'s first
    part) called on ``args``: a ``copy_`` between dtypes is a cast, any other a
    layout op."""
    base = name.rstrip('_')
    if name.startswith(GEMM_OPS):
        return 'gemm'
    if base in CAST_OPS or base == 'copy' and args[0].dtype != args[1].dtype:
        return 'cast'
    if base in LAYOUT_OPS:
        return 'layout'
    return 'index' if base in INDEX_OPS else 'elementwise'


# -----------------------------------------------------------------------------
# Stand-ins for fused GPU kernels: one op forward, one backward, a FLOP formula
# of the shapes the kernel runs, and a fake implementation (shapes only) for
# FakeTensorMode. Their CPU implementations compute the same values in float32
# for --real. Outputs are laid out as the fused kernels allocate them, each in
# the dim order of the input it belongs to (the output and the query's gradient
# the query's): the ops after them see the strides a GPU gives, and real and
# fake tensors give the same (a copy where they differ is a launch).

_sdpa = F.scaled_dot_product_attention


def _dense_like(like, shape=None):
    """An empty tensor of ``shape`` (default ``like``'s) laid out densely in
    ``like``'s dim order (inductor's ``infer_dense_strides`` for
    FlexAttention's outputs; ``empty_like`` for ATen's fused SDPA)."""
    # outermost first
    order = sorted(range(like.dim()), key=lambda d: -like.stride(d))
    return torch.empty_permuted(
        like.shape if shape is None else shape,
        order,
        dtype=like.dtype,
        device=like.device)


def _laid_out(values, likes):
    """Each of ``values`` copied into :func:`_dense_like` its ``like`` (in the
    ``like``'s dtype)."""
    return tuple(
        _dense_like(like, value.shape).copy_(value)
        for value, like in zip(values, likes))


@torch.library.custom_op('aa_bench::fused_sdpa', mutates_args=())
def fused_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
    """SDPA as one op, as CUDA's fused kernels run it (computed by the CPU's
    math kernel)."""
    return _laid_out([_sdpa(q, k, v, scale=scale)], [q])[0]


@torch.library.custom_op('aa_bench::fused_sdpa_backward', mutates_args=())
def fused_sdpa_backward(
        grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Its backward as one op (the math kernel's formulas, in float32)."""
    likes, (g, q, k, v) = (q, k, v), (t.float() for t in (grad, q, k, v))
    p = (q @ k.transpose(-1, -2) * scale).softmax(-1)  # [B, Nh, N, N]
    dp = g @ v.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return _laid_out((ds @ k * scale, ds.transpose(-1, -2) @ q * scale,
                      p.transpose(-1, -2) @ g), likes)


@fused_sdpa.register_fake
def _(q, k, v, scale):
    return _dense_like(q, (*q.shape[:-1], v.shape[-1]))


@fused_sdpa_backward.register_fake
def _(grad, q, k, v, scale):
    return _dense_like(q), _dense_like(k), _dense_like(v)


def _sdpa_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3])
    ctx.scale = inputs[3]


def _sdpa_backward(ctx, grad):
    return (*fused_sdpa_backward(grad, *ctx.saved_tensors, ctx.scale), None)


fused_sdpa.register_autograd(_sdpa_backward, setup_context=_sdpa_setup_context)


@register_flop_formula(torch.ops.aa_bench.fused_sdpa)
def _fused_sdpa_flops(q_shape, k_shape, v_shape, *args, **kwargs):
    return sdpa_flop_count(q_shape, k_shape, v_shape)


@register_flop_formula(torch.ops.aa_bench.fused_sdpa_backward)
def _fused_sdpa_backward_flops(grad_shape, q_shape, k_shape, v_shape, *args,
                               **kwargs):
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape, v_shape)


def _counted_sdpa(q,
                  k,
                  v,
                  attn_mask=None,
                  dropout_p=0.0,
                  is_causal=False,
                  scale=None,
                  **kwargs):
    assert (attn_mask is None and dropout_p == 0 and not is_causal
            and not kwargs)
    return fused_sdpa(q, k, v, q.shape[-1]**-0.5 if scale is None else scale)


def _relative_bias(rel, rows_h):
    """``[B, Nh, N, H, W]`` (in float32): query ``i``'s relative logit with key
    ``(h_j, w_j)``, ``S^H[.., i, h_j] + S^W[.., i, w_j]``, gathered from the
    relative logits by offset ``rel`` ``[B, Nh, H, W, 2 mh - 1 + 2 mw - 1]``
    (the first ``rows_h`` rows ``r^H``'s, offsets beyond ``m - 1`` clipped);
    and the offset index of each table, which maps the gradient back."""
    B, Nh, H, W = rel.shape[:4]
    rel_h, rel_w = rel.float().split([rows_h, rel.shape[-1] - rows_h], -1)

    # [length (query), length (key)]: the offset's row, clipped
    def index(length, rows):
        pos, m = torch.arange(length), (rows + 1) // 2
        return (pos[None, :] - pos[:, None]).clamp(1 - m, m - 1) + m - 1

    index_h = index(H, rel_h.shape[-1])[None, None, :,
                                        None, :].expand(B, Nh, H, W, H)
    index_w = index(W, rel_w.shape[-1])[None, None,
                                        None].expand(B, Nh, H, W, W)
    by_key_h = rel_h.gather(-1, index_h).flatten(2, 3)  # [B, Nh, N, H]
    by_key_w = rel_w.gather(-1, index_w).flatten(2, 3)  # [B, Nh, N, W]
    return by_key_h[..., None] + by_key_w[..., None, :], index_h, index_w


def _flex_probabilities(q, k, rel, rows_h, scale):
    """Softmax of ``scale q k^T`` plus the relative logits, in float32; and the
    indices of :func:`_relative_bias`."""
    logits = q.float() @ k.float().transpose(-1, -2) * scale  # [B, Nh, N, N]
    index_h = index_w = None
    if rel is not None:
        bias, index_h, index_w = _relative_bias(rel, rows_h)
        logits = logits + bias.flatten(-2)
    return logits.softmax(-1), index_h, index_w


@torch.library.custom_op('aa_bench::flex_attention', mutates_args=())
def flex_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   rel: Optional[torch.Tensor], rows_h: int,
                   scale: float) -> torch.Tensor:
    """AA's FlexAttention as one op, ``softmax(scale q k^T + S^H + S^W) v``:
    the fused Triton kernel CUDA runs, its ``score_mod`` adding the relative
    logits read from ``rel`` (:func:`_relative_bias`)."""
    p, _, _ = _flex_probabilities(q, k, rel, rows_h, scale)
    return _laid_out([p @ v.float()], [q])[0]


#: gradients of q, k, v and rel
FlexGrads = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.custom_op('aa_bench::flex_attention_backward', mutates_args=())
def flex_attention_backward(grad: torch.Tensor, q: torch.Tensor,
                            k: torch.Tensor, v: torch.Tensor,
                            rel: Optional[torch.Tensor], rows_h: int,
                            scale: float) -> FlexGrads:
    """Its backward as one op (FlexAttention's kernel takes the gradients of
    the tensors its ``score_mod`` reads too): ``dq, dk, dv, drel`` (the last
    empty without relative logits)."""
    p, index_h, index_w = _flex_probabilities(q, k, rel, rows_h, scale)
    g, qf, kf, vf = (t.float() for t in (grad, q, k, v))
    dp = g @ vf.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))  # d logits, [B, Nh, N, N]
    grads = [
        ds @ kf * scale,
        ds.transpose(-1, -2) @ qf * scale,
        p.transpose(-1, -2) @ g
    ]
    grads = _laid_out(grads, (q, k, v))
    if rel is None:
        return (*grads, q.new_empty(0))
    B, Nh, H, W = rel.shape[:4]
    # [B, Nh, N, H], [B, Nh, N, W]
    d_h, d_w = ds.unflatten(-1, (H, W)).sum(-1), ds.unflatten(-1,
                                                              (H, W)).sum(-2)
    # back to the offsets' rows
    d_rel = rel.new_zeros(rel.shape, dtype=torch.float32)
    d_rel[..., :rows_h].scatter_add_(-1, index_h, d_h.unflatten(2, (H, W)))
    d_rel[..., rows_h:].scatter_add_(-1, index_w, d_w.unflatten(2, (H, W)))
    # contiguous, as the kernel's scatter writes it
    return (*grads, d_rel.to(rel.dtype))


@flex_attention.register_fake
def _(q, k, v, rel, rows_h, scale):
    return _dense_like(q, (*q.shape[:-1], v.shape[-1]))


@flex_attention_backward.register_fake
def _(grad, q, k, v, rel, rows_h, scale):
    d_rel = q.new_empty(0) if rel is None else rel.new_empty(rel.shape)
    return _dense_like(q), _dense_like(k), _dense_like(v), d_rel


def _flex_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:4])
    ctx.rows_h, ctx.scale = inputs[4:6]


def _flex_backward(ctx, grad):
    # once: a checkpointed block's tensors unpack once
    saved = ctx.saved_tensors
    dq, dk, dv, d_rel = flex_attention_backward(grad, *saved, ctx.rows_h,
                                                ctx.scale)
    return dq, dk, dv, None if saved[3] is None else d_rel, None, None


flex_attention.register_autograd(
    _flex_backward, setup_context=_flex_setup_context)


def flex_head_dim(d):
    """The head dim FlexAttention's Triton kernel computes on: the next power
    of two, at least 16 (its ``tl.dot`` tiles; 20 -> 32, 3 -> 16)."""
    return max(16, 1 << (d - 1).bit_length())


def _flex_shapes(*shapes):
    return [(*shape[:-1], flex_head_dim(shape[-1])) for shape in shapes]


@register_flop_formula(torch.ops.aa_bench.flex_attention)
def flex_attention_flops(q_shape, k_shape, v_shape, *args, **kwargs):
    """FlexAttention's forward as the fused kernel runs it: SDPA's two GEMMs on
    the padded head dims, ``2 B Nh N N (dk_pad + dv_pad)``. The ``score_mod``'s
    gathers and adds (two table reads and two adds per logit, no GEMM) count
    nothing, as the softmax counts nothing in SDPA's formula."""
    return sdpa_flop_count(*_flex_shapes(q_shape, k_shape, v_shape))


@register_flop_formula(torch.ops.aa_bench.flex_attention_backward)
def _flex_attention_backward_flops(grad_shape, q_shape, k_shape, v_shape,
                                   *args, **kwargs):
    """Its backward as the Triton kernel runs it, on the padded shapes: two
    passes over the logits, each recomputing them, the queries' (``q k^T``,
    ``dO v^T``, ``dS k``) and the keys' (``k q^T``, ``P^T dO``, ``v dO^T``,
    ``dS^T q``): seven products, SDPA's backward formula (five) plus a
    forward's worth. The relative logits' gradients (the ``score_mod``'s
    gathers summed back, no GEMM) count nothing."""
    grad_shape, q_shape, k_shape, v_shape = _flex_shapes(
        grad_shape, q_shape, k_shape, v_shape)
    return sdpa_backward_flop_count(grad_shape, q_shape, k_shape,
                                    v_shape) + sdpa_flop_count(
                                        q_shape, k_shape, v_shape)


def _counted_flex(q, k, v, rel, rows_h, scale, rel_scale=None):
    """``aa_conv.attention_flex`` while counting: the stand-in op (eager, where
    ``rel_scale`` is ``scale``)."""
    assert rel_scale in (None, scale)
    return flex_attention(q, k, v, rel, int(rows_h), float(scale))


def flop_formula(func):
    """The FLOP formula of op overload ``func``, or None: registered under its
    packet (aten's; the stand-ins' on torch 2.14) or under the overload (the
    stand-ins' on torch 2.4)."""
    return flop_registry.get(func._overloadpacket, flop_registry.get(func))


# the in-place product (GSA's content gradient) as the out-of-place one
register_flop_formula(torch.ops.aten.baddbmm_, get_raw=True)(baddbmm_flop)


def _focal_loss(pred, labels, gamma, alpha):
    """Unreduced sigmoid focal loss of class indices (``num_classes``:
    background), mmdet's Python form."""
    from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
    target = F.one_hot(labels,
                       pred.size(1) + 1)[:, :pred.size(1)].to(pred.dtype)
    return py_sigmoid_focal_loss(
        pred, target, gamma=gamma, alpha=alpha, reduction='none')


@torch.library.custom_op('aa_bench::sigmoid_focal_loss', mutates_args=())
def counted_focal_loss(pred: torch.Tensor, labels: torch.Tensor, gamma: float,
                       alpha: float) -> torch.Tensor:
    """mmcv's ``sigmoid_focal_loss`` CUDA kernel (unreduced, labels as indices)
    as one op."""
    return _focal_loss(pred, labels, gamma, alpha)


@torch.library.custom_op(
    'aa_bench::sigmoid_focal_loss_backward', mutates_args=())
def counted_focal_loss_backward(grad: torch.Tensor, pred: torch.Tensor,
                                labels: torch.Tensor, gamma: float,
                                alpha: float) -> torch.Tensor:
    """Its backward as one op: with ``p = sigmoid(x)``, ``pt`` the probability
    of the wrong answer and ``w = (alpha t + (1 - alpha)(1 - t)) pt^gamma``,
    ``d loss / dx = (p - t) w + bce dw/dx``."""
    x = pred.float()
    t = F.one_hot(labels, x.size(1) + 1)[:, :x.size(1)].to(x.dtype)
    p = x.sigmoid()
    pt = (1 - p) * t + p * (1 - t)
    a = alpha * t + (1 - alpha) * (1 - t)
    bce = F.binary_cross_entropy_with_logits(x, t, reduction='none')
    dw = a * gamma * pt.pow(gamma - 1) * (1 - 2 * t) * p * (1 - p)
    return (grad.float() * ((p - t) * a * pt.pow(gamma) + bce * dw)).to(
        pred.dtype)


def _focal_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:2])
    ctx.gamma, ctx.alpha = inputs[2:]


def _focal_backward(ctx, grad):
    return counted_focal_loss_backward(grad, *ctx.saved_tensors, ctx.gamma,
                                       ctx.alpha), None, None, None


counted_focal_loss.register_autograd(
    _focal_backward, setup_context=_focal_setup)


@contextlib.contextmanager
def cuda_focal_loss(loss_cls):
    """``loss_cls`` (an mmdet ``FocalLoss``) takes its CUDA path, mmcv's kernel
    counted as one op."""
    from mmdet.models.losses import focal_loss
    kernel = focal_loss._sigmoid_focal_loss

    def forward(pred,
                target,
                weight=None,
                avg_factor=None,
                reduction_override=None):
        # as Float32FocalLoss
        pred = pred.float() if pred.dtype == torch.bfloat16 else pred
        return loss_cls.loss_weight * focal_loss.sigmoid_focal_loss(
            pred,
            target,
            weight,
            gamma=loss_cls.gamma,
            alpha=loss_cls.alpha,
            reduction=reduction_override or loss_cls.reduction,
            avg_factor=avg_factor)

    focal_loss._sigmoid_focal_loss = (
        lambda pred, labels, gamma, alpha, *args: counted_focal_loss(
            pred, labels, gamma, alpha))
    loss_cls.forward = forward
    try:
        yield
    finally:
        focal_loss._sigmoid_focal_loss = kernel
        del loss_cls.forward


@contextlib.contextmanager
def cuda_kernels():
    """The layers take CUDA's choices on CPU (and fake) tensors
    (``forced_device_policy('cuda')``), their fused kernels counted as the
    stand-in ops: AA's FlexAttention (``aa_conv.attention_flex``) and SDPA."""
    from aa_det.models.layers import aa_conv
    from aa_det.models.layers.device_policy import forced_device_policy
    attention_flex = aa_conv.attention_flex
    F.scaled_dot_product_attention, aa_conv.attention_flex = (_counted_sdpa,
                                                              _counted_flex)
    try:
        with forced_device_policy('cuda'):
            yield
    finally:
        F.scaled_dot_product_attention, aa_conv.attention_flex = (
            _sdpa, attention_flex)


# -----------------------------------------------------------------------------
# Counting


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _storage_key(storage):
    """A storage's identity while it lives (its ``StorageImpl``; fake storages
    have no data pointer)."""
    return storage._cdata


class ModuleScopes:
    """The module path each op belongs to: in the forward the innermost module
    running; in the backward the module whose forward created the autograd node
    running (found by its sequence number among the numbers taken when modules
    were entered and left), a parameter's gradient accumulation its module's,
    and a forward recomputed in the backward (``with_cp``) the innermost module
    running.

    Args:
        model (nn.Module): the modules, by ``named_modules`` path ('' the model
            itself).
    """

    def __init__(self, model):
        self.model, self.stack = model, ['']
        # from autograd sequence number seqs[i] on, nodes are paths[i]'s
        self.seqs, self.paths = [0], ['']
        self.params = {
            id(p): name.rpartition('.')[0]
            for name, p in model.named_parameters()
        }

    def _mark(self):
        self.seqs.append(torch._C._autograd._get_sequence_nr())
        self.paths.append(self.stack[-1])

    def _enter(self, name):
        self.stack.append(name)
        self._mark()

    def _leave(self, module, args, output):
        self.stack.pop()
        self._mark()  # returns None: the output is kept

    def __enter__(self):
        self._handles = [
            h for name, m in self.model.named_modules()
            for h in (m.register_forward_pre_hook(
                lambda m, args, name=name: self._enter(name)),
                      m.register_forward_hook(self._leave, always_call=True))
        ]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()

    def current(self):
        """``(path, 'forward' | 'backward')`` of the op being dispatched."""
        node = torch._C._current_autograd_node()
        if node is None:
            return self.stack[-1], 'forward'
        # a checkpointed block's forward recomputed in the backward
        if len(self.stack) > 1:
            return self.stack[-1], 'backward'
        if 'AccumulateGrad' in node.name():
            return self.params.get(id(node.variable), ''), 'backward'
        return self.paths[bisect.bisect_right(self.seqs, node._sequence_nr()) -
                          1], 'backward'


class OpCounter(TorchDispatchMode):
    """Counts non-view aten ops, their FLOPs, the bytes of the non-GEMM ones
    and peak live bytes; with a ``model``, also by module path, phase and kind
    (:attr:`by_module`).

    Live bytes: every storage an op returns is counted from its creation until
    it is freed (a weak reference on the storage's Python object, which lives
    as long as the storage; real or fake).

    Args:
        model (nn.Module, optional): attributes each op to one of its modules
            (:class:`ModuleScopes`).
    """

    def __init__(self, model=None):
        super().__init__()
        self.ops, self.bytes, self.flops = collections.Counter(
        ), collections.Counter(), collections.Counter()
        #: ``(path, phase, kind) -> [ops, bytes, flops]``
        self.by_module = collections.defaultdict(lambda: [0, 0, 0])
        self.live = self.peak = 0
        self._seen = {}
        self.scopes = ModuleScopes(model) if model is not None else None

    def __enter__(self):
        if self.scopes:
            self.scopes.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if self.scopes:
            self.scopes.__exit__(*exc)

    def _track(self, t):
        storage = t.untyped_storage()
        key, size = _storage_key(storage), storage.nbytes()
        if size == 0 or key in self._seen:
            return
        self._seen[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)

        def free(key=key, size=size):
            if self._seen.pop(key, None) is not None:
                self.live -= size

        weakref.finalize(storage, free)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split('.')[0]
        if func.is_view or name in NO_KERNEL_OPS or not _tensors(out):
            return out
        kind = op_kind(name, args)
        size = 0 if kind == 'gemm' else sum(t.numel() * t.element_size()
                                            for t in _tensors((args, kwargs,
                                                               out)))
        formula = flop_formula(func)
        flops = formula(*args, **kwargs, out_val=out) if formula else 0
        self.ops[name] += 1
        self.bytes[name] += size
        self.flops[name] += flops
        if self.scopes:
            counts = self.by_module[(*self.scopes.current(), kind)]
            counts[0] += 1
            counts[1] += size
            counts[2] += flops
        for t in _tensors(out):
            self._track(t)
        return out

    def totals(self, prefix=None, phase=None):
        """``{kind: [ops, bytes, flops]}`` of the modules at or under path
        ``prefix`` (None: all ops) in ``phase`` ('forward', 'backward'; None:
        both)."""
        kinds = {kind: [0, 0, 0] for kind in KINDS}
        for (path, ph, kind), counts in self.by_module.items():
            if (prefix is None or path == prefix
                    or path.startswith(prefix + '.')) and phase in (None, ph):
                kinds[kind] = [a + b for a, b in zip(kinds[kind], counts)]
        return kinds

    def module_counts(self, path):
        """The forward + backward of module ``path`` (its submodules'
        included): ``ops``, ``ops_forward``, ``ops_backward``, ``flops`` and
        ``kinds`` (ops by kind)."""
        forward, backward = self.totals(path, 'forward'), self.totals(
            path, 'backward')
        ops_forward, ops_backward = (
            sum(c[0] for c in phase.values()) for phase in (forward, backward))
        return dict(
            ops=ops_forward + ops_backward,
            ops_forward=ops_forward,
            ops_backward=ops_backward,
            flops=sum(forward[kind][2] + backward[kind][2] for kind in KINDS),
            kinds={
                kind: forward[kind][0] + backward[kind][0]
                for kind in KINDS
            })


class SavedForBackward:
    """Bytes a forward saves for its backward, by the innermost module running
    when each tensor was saved (``torch.autograd.graph.saved_tensors_hooks``):
    distinct storages, parameters excluded, so a tensor saved by two ops (a
    ReLU's output and the next conv's input) counts once, for the first.
    """

    def __init__(self, model):
        self.model, self.names, self.by_module = model, [
            ''
        ], collections.Counter()
        self._skip = {
            _storage_key(p.untyped_storage())
            for p in model.parameters()
        }

    def _pack(self, t):
        storage = t.untyped_storage()
        if _storage_key(storage) not in self._skip:
            self._skip.add(_storage_key(storage))
            self.by_module[self.names[-1]] += storage.nbytes()
        return t

    def _leave(self, module, args, output):
        self.names.pop()  # returns None: the output is kept

    def __enter__(self):
        self._handles = [
            h for name, m in self.model.named_modules()
            for h in (m.register_forward_pre_hook(
                lambda m, args, name=name: self.names.append(name)),
                      m.register_forward_hook(self._leave, always_call=True))
        ]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()

    def by_kind(self):
        """Bytes by module path within a residual block (``conv2``,
        ``conv2.norm_col``, ``downsample.1``; the block's own ops ``block``;
        outside the stages ``stem.<name>``), summed over the blocks."""
        kinds = collections.Counter()
        for name, size in self.by_module.items():
            parts = name.split('.')
            if parts[0].startswith('layer'):
                kinds['.'.join(parts[2:])
                      or ('block' if len(parts) == 2 else 'stage')] += size
            else:
                kinds[f'stem.{name}' if name else 'backbone'] += size
        return kinds


# -----------------------------------------------------------------------------
# Models and sizes


def parse_size(text):
    """``'640'`` -> ``(640, 640)``; ``'1333x800'`` (width x height, mmdet's
    order) -> ``(800, 1333)``: ``(H, W)``."""
    width, _, height = text.lower().partition('x')
    return int(height or width), int(width)


def padded(size, divisor):
    """``(H, W)`` rounded up to multiples of ``divisor`` (mmdet's
    ``DetDataPreprocessor.pad_size_divisor``)."""
    return tuple(-(-s // divisor) * divisor for s in size)


def build(name, step, norm_eval, with_cp):
    """The backbone, or with ``step`` the RetinaNet of its COCO scratch config
    (BatchNorm in one process)."""
    # isort: off
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    # isort: on
    init_default_scope('mmdet')
    if not step:
        return MODELS.build(
            dict(
                BACKBONES[name],
                out_indices=(0, 1, 2, 3),
                frozen_stages=-1,
                norm_eval=norm_eval,
                with_cp=with_cp))
    cfg = Config.fromfile(CONFIGS[name])
    cfg.model.backbone.update(norm_eval=norm_eval, with_cp=with_cp)
    # None: every stage, the class's default
    if cfg.model.backbone.type == 'GSAResNet':
        cfg.model.backbone.stage_with_attention = BACKBONES[name].get(
            'stage_with_attention')
    # one process: BN for the config's SyncBN
    return revert_sync_batchnorm(MODELS.build(cfg.model))


def detection_samples(batch, size):
    """One generated box per image, with the metainfo RetinaNet's loss reads;
    ``size`` ``(H, W)``."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    H, W = size
    samples = []
    for i in range(batch):
        sample = DetDataSample(
            metainfo=dict(
                img_shape=size,
                pad_shape=size,
                batch_input_shape=size,
                scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([[0.1 * W, 0.2 * H, 0.5 * W, 0.7 * H]]),
            labels=torch.tensor([i % 80]))
        samples.append(sample)
    return samples


def to_fake(model, fake_mode):
    """``model``'s parameters and buffers as fake tensors of ``fake_mode`` (in
    place; parameters stay parameters, leaves whose gradients the backward
    writes)."""
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = nn.Parameter(
                    fake_mode.from_tensor(p), requires_grad=p.requires_grad)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fake_mode.from_tensor(b)
    return model


def drop_constants():
    """Empties ``aa_det``'s per-size caches (the tensors in its module-level
    dicts, its ``lru_cache`` functions) around a count on fake tensors: its
    first pass fills them as a run's first step does (tables made once per
    size), with its own tensors, not another count's; and no later count meets
    its fake tensors."""
    for name, module in list(sys.modules.items()):
        if not name.startswith('aa_det') or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, dict):
                for key in [
                        k for k, v in value.items()
                        if isinstance(v, torch.Tensor)
                ]:
                    del value[key]
            elif callable(getattr(value, 'cache_clear', None)):
                value.cache_clear()


def attention_layers(model):
    """Paths of ``model``'s attention layers (AA and GSA)."""
    from aa_det.models.layers import AAConv2d, GlobalSelfAttention2d
    return [
        name for name, m in model.named_modules()
        if isinstance(m, (AAConv2d, GlobalSelfAttention2d))
    ]


def measure(name,
            size,
            batch,
            policy='cuda',
            dtype=torch.float16,
            norm_eval=False,
            with_cp=False,
            step=False,
            fake=True,
            layer='layer3.0.conv2'):
    """One backbone forward + backward (with ``step``: one RetinaNet loss +
    backward) at ``size`` ``(H, W)``; returns a dict: ``ops``, ``flops``,
    ``attention_flops`` (the attention kernels'), non-GEMM ``bytes``, ``peak``
    bytes, ``kinds`` (:meth:`OpCounter.totals` by kind as dicts), ``layers``
    (every attention layer's and ``layer``'s ops and FLOPs, forward +
    backward, by kind), the op tables ``table``, ``bytes_table``, and the bytes
    saved for the backward by module kind (``saved``,
    :class:`SavedForBackward`). ``fake``: on fake tensors (not with
    ``step``)."""
    import aa_det  # noqa: F401  (registers the backbones)
    assert not (
        fake and
        step), 'a RetinaNet step (its anchor assignment) needs real tensors'
    torch.manual_seed(0)
    model = build(name, step, norm_eval, with_cp)
    model.train()
    # ``layer`` in the backbone, also where it is the detector's
    # (``backbone.layer3.0.conv2``)
    found = [
        path for path, _ in model.named_modules()
        if path == layer or path.endswith('.' + layer)
    ]
    if not found:
        raise ValueError(f'{name} has no module {layer!r}')
    layer = found[0]
    fake_mode = FakeTensorMode(
        allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    if fake:
        drop_constants()
        to_fake(model, fake_mode)
    counter, saved = OpCounter(model), SavedForBackward(model)
    kernels = cuda_kernels() if policy == 'cuda' else contextlib.nullcontext()
    amp = dict(device_type='cpu', dtype=dtype, enabled=dtype != torch.float32)

    with fake_mode, kernels:
        x = torch.randn(batch, 3, *size)
        if step:
            samples = detection_samples(batch, size)

            def loss():
                return sum(
                    v if isinstance(v, torch.Tensor) else sum(v)
                    for v in model.loss(x, samples).values())

            loss_kernel = cuda_focal_loss(
                model.bbox_head.loss_cls
            ) if policy == 'cuda' else contextlib.nullcontext()
        else:

            def loss():
                return sum(f.float().mean() for f in model(x))

            loss_kernel = contextlib.nullcontext()
        with loss_kernel:
            # a first pass, as a run's first step (tables made once per size)
            with torch.autocast(**amp):
                loss()
            # no gradients held, as mmengine's OptimWrapper leaves them after
            # each step (torch's zero_grad(set_to_none=True)): the backward
            # writes each gradient, no accumulation kernel per parameter
            model.zero_grad(set_to_none=True)
            with counter, saved:
                # a new autocast context per step, as in training: weights cast
                # anew
                with torch.autocast(**amp):
                    value = loss()
                value.backward()
    if fake:
        drop_constants()
    layers = {
        path: counter.module_counts(path)
        for path in attention_layers(model) + [layer]
    }
    return dict(
        ops=sum(counter.ops.values()),
        flops=sum(counter.flops.values()),
        attention_flops=sum(n for op, n in counter.flops.items()
                            if op.startswith(ATTENTION_OPS)),
        bytes=sum(counter.bytes.values()),
        peak=counter.peak,
        kinds={
            kind: dict(zip(('ops', 'bytes', 'flops'), c))
            for kind, c in counter.totals().items()
        },
        layers=layers,
        layer=layer,
        attention_layers=attention_layers(model),
        table=counter.ops,
        bytes_table=counter.bytes,
        saved=saved.by_kind())


# -----------------------------------------------------------------------------
# Report


def layer_line(r, layer):
    """One line: ``layer``'s ops forward + backward by kind, the mean over the
    attention layers and the attention kernels' FLOPs."""
    one = r['layers'][layer]
    kinds = ', '.join(f'{kind} {one["kinds"][kind]}' for kind in KINDS)
    line = ((
        f'    {layer}: {one["ops"]} ops (forward {one["ops_forward"]}, '
        f'backward {one["ops_backward"]}; {kinds}), {one["flops"] / 1e9:.1f} '
        f'GFLOP'))
    paths = r['attention_layers']
    if paths:
        mean_ops = sum(r['layers'][p]['ops'] for p in paths) / len(paths)
        line += (f'; mean of the {len(paths)} attention layers {mean_ops:.1f} '
                 f'ops')
    if r['attention_flops']:
        line += f'; attention kernels {r["attention_flops"] / 1e9:.1f} GFLOP'
    return line


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--size',
        nargs='+',
        default=['640'],
        metavar='S|WxH',
        help="input sizes: S for S x S, or WIDTHxHEIGHT as mmdet's scales "
        "('1333x800': 1333 wide, 800 high, counted padded to 1344x800); "
        "default 640")
    parser.add_argument(
        '--pad-divisor',
        type=int,
        default=32,
        help="the input padded to multiples of this (the configs' "
        "DetDataPreprocessor: 32)")
    parser.add_argument('--batch', type=int, nargs='+', default=[2, 8])
    parser.add_argument(
        '--models',
        nargs='+',
        default=list(BACKBONES)[:3],
        choices=list(BACKBONES),
        help="default: the three detection backbones; add 'GSA-ResNet-50, all "
        "stages'")
    parser.add_argument('--policy', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument(
        '--amp',
        default='fp16',
        choices=list(AMP),
        help="autocast dtype: fp16 (default, what tools/train.py --amp runs "
        "on CUDA), bf16, fp32 (no autocast)")
    parser.add_argument(
        '--real',
        action='store_true',
        help='real CPU tensors instead of fake ones (the same counts, minutes '
        'instead of seconds at 640x640 batch 8)')
    parser.add_argument(
        '--step',
        action='store_true',
        help='count a whole RetinaNet training step (backbone, FPN, head, '
        'losses, backward) instead of the backbone alone (real tensors)')
    parser.add_argument(
        '--by-kind',
        action='store_true',
        help='also print ops and non-GEMM GiB by kind of op (gemm, cast, '
        'layout, index, elementwise)')
    parser.add_argument(
        '--layer',
        default='layer3.0.conv2',
        help='the module whose forward + backward ops are printed per model '
        '(default layer3.0.conv2: an AA or GSA layer, or a 3x3 conv of '
        'ResNet-50)')
    parser.add_argument(
        '--top',
        type=int,
        default=0,
        help='also print the N most frequent ops per model')
    parser.add_argument(
        '--saved',
        action='store_true',
        help='also print the bytes saved for the backward, by module kind '
        '(SavedForBackward)')
    parser.add_argument(
        '--norm-eval',
        action='store_true',
        help="BatchNorm frozen in eval mode (mmdet's ResNet default, for "
        "pretrained backbones; how the counts before 2026-11-24 were "
        "taken); default: BatchNorm trains, as in the from-scratch "
        "recipe (norm_eval=False)")
    parser.add_argument(
        '--json',
        metavar='FILE',
        help="also write the settings, the commit and each model's figures as "
        "JSON (docs/data/): results_by_size, and results_by_batch of the "
        "first size")
    parser.add_argument(
        '--with-cp',
        action='store_true',
        help="mmdet's with_cp: each residual block recomputes its forward in "
        "the backward (memory for time and launches)")
    args = parser.parse_args()
    dtype = AMP[args.amp]
    fake = not (args.real or args.step)
    what = ('RetinaNet training step' if args.step else 'backbone '
            'forward+backward')
    print(f'policy={args.policy} on the CPU, {"real" if not fake else "fake"} '
          f'tensors, '
          f'{args.amp if args.amp == "fp32" else args.amp + " autocast"}, '
          f'{what}, BatchNorm '
          f'{"frozen (norm_eval)" if args.norm_eval else "training"}'
          f'{", with_cp" if args.with_cp else ""}; ops = non-view aten ops '
          f'dispatched')
    results, inputs = {}, {}
    for label in args.size:
        size = padded(parse_size(label), args.pad_divisor)
        inputs[label] = list(size)
        print(f'\n{label} (input {size[1]}x{size[0]}, W x H)')
        print(
            f'{"model":<26} {"batch":>5} | {"ops":>6} {"x R50":>6} | '
            f'{"GFLOP":>8} {"x R50":>6} | {"non-GEMM GiB":>12} {"x R50":>6} | '
            f'{"peak GiB":>8} {"x R50":>6} | {"s":>5}')
        by_kind = []
        for batch in args.batch:
            base = None
            for name in args.models:
                start = time.perf_counter()
                r = measure(name, size, batch, args.policy, dtype,
                            args.norm_eval, args.with_cp, args.step, fake,
                            args.layer)
                seconds = time.perf_counter() - start
                results.setdefault(label, {}).setdefault(
                    str(batch), {})[name] = dict({
                        key: r[key]
                        for key in ('ops', 'flops', 'attention_flops', 'bytes',
                                    'peak', 'kinds', 'layers')
                    })
                base = r if name == 'ResNet-50' else base

                def ratio(key, r=r, base=base):
                    return (f'{r[key] / base[key]:6.2f}'
                            if base else f'{"-":>6}')

                print(
                    f'{name:<26} {batch:>5} | {r["ops"]:6d} {ratio("ops")} | '
                    f'{r["flops"] / 1e9:8.1f} {ratio("flops")} | '
                    f'{r["bytes"] / 2 ** 30:12.2f} {ratio("bytes")} | '
                    f'{r["peak"] / 2 ** 30:8.2f} {ratio("peak")} | '
                    f'{seconds:5.1f}',
                    flush=True)
                print(layer_line(r, r['layer']))
                if args.top:
                    print('    ' + ', '.join(
                        f'{op} {n} ({r["bytes_table"][op] / 2 ** 30:.2f} GiB)'
                        for op, n in r['table'].most_common(args.top)))
                if args.saved:
                    print(f'    saved for the backward '
                          f'{sum(r["saved"].values()) / 2 ** 30:.3f} GiB: ' +
                          ', '.join(f'{kind} {n / 2 ** 30:.3f}'
                                    for kind, n in r['saved'].most_common()))
                by_kind.append((name, batch, r['kinds']))
        if args.by_kind:
            print(f'\nby kind, {label}: ops | non-GEMM GiB')
            print(f'{"model":<26} {"batch":>5} | ' + ' '.join(f'{k:>11}'
                                                              for k in KINDS) +
                  ' | ' + ' '.join(f'{k:>11}' for k in KINDS[1:]))
            for name, batch, kinds in by_kind:
                print(f'{name:<26} {batch:>5} | ' +
                      ' '.join(f'{kinds[k]["ops"]:11d}' for k in KINDS) +
                      ' | ' + ' '.join(f'{kinds[k]["bytes"] / 2 ** 30:11.2f}'
                                       for k in KINDS[1:]))
    if args.json:
        import json
        import subprocess
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'],
                                capture_output=True,
                                text=True,
                                cwd=ROOT).stdout.strip()
        settings = {k: v for k, v in vars(args).items() if k != 'json'}
        settings.update(
            size=args.size[0], sizes=args.size, inputs_hw=inputs, fake=fake)
        with open(args.json, 'w') as f:
            json.dump(
                dict(
                    benchmark='op_counts',
                    commit=commit,
                    torch=torch.__version__,
                    settings=settings,
                    results_by_batch=results[args.size[0]],
                    results_by_size=results),
                f,
                indent=1)


if __name__ == '__main__':
    main()
